"""What preemption promised and has not delivered yet.

- *claims*: a running victim's slot is promised to a more urgent class (``incoming`` per
  class counts them); the victim is stopping, or *draining* (left to end by a deadline,
  past which it is preempted);
- *reservations*: a claimed slot that came free is held for the class it was freed for
  (``reserved`` per class), so that the next dispatch gives it to that class;
- *barren marks*: the slot-change count at which a victim search for a class found
  nothing (no search again until a slot changed hands);
- *clearings* (GPU fleets): replicas being cleared for a model, until when, and whether
  by draining only.

:class:`Promises` owns these figures and keeps them consistent with the requests'
``claimed_for`` (:meth:`check`).
"""

from __future__ import annotations

from collections.abc import Iterable

from laneway.core.request import Request


class Promises:
    __slots__ = ("barren", "clearing", "drains", "incoming", "reserved", "reserved_total")

    def __init__(self, k: int) -> None:
        self.incoming = [0] * k  # slots promised to a class: victims draining or stopping
        self.reserved = [0] * k  # freed slots held for a class
        self.reserved_total = 0
        self.barren = [-1] * k  # the slot-change count when a victim search for a class found none
        self.drains: dict[str, Request] = {}  # victims left to end, by id
        # model -> (until when replicas are being cleared for it, by draining only?)
        self.clearing: dict[str, tuple[float, bool]] = {}

    def claim(self, victim: Request, c: int) -> None:
        """``victim``'s slot is promised to class ``c``."""
        victim.claimed_for = c
        self.incoming[c] += 1

    def drain(self, victim: Request, deadline_s: float) -> None:
        """The claimed ``victim`` is left to end until ``deadline_s``."""
        victim.claim_deadline_s = deadline_s
        self.drains[victim.id] = victim

    def lapse(self, victim: Request) -> None:
        """The claim on ``victim`` is withdrawn (its claimant needs it no more, or may not
        preempt it any more)."""
        c = victim.claimed_for
        assert c is not None
        victim.claimed_for = None
        self.incoming[c] -= 1
        self.drains.pop(victim.id, None)

    def stopping(self, victim: Request) -> None:
        """The claimed ``victim`` is preempted now: no longer draining."""
        self.drains.pop(victim.id, None)

    def freed(self, req: Request) -> None:
        """``req``'s slot came free: if it was claimed, it is reserved for its claimant."""
        c = req.claimed_for
        if c is not None:
            self.incoming[c] -= 1
            self.reserved[c] += 1
            self.reserved_total += 1
            req.claimed_for = None
            self.drains.pop(req.id, None)

    def use_reserved(self, c: int) -> None:
        """A reserved slot of class ``c`` goes to a request of it."""
        self.reserved[c] -= 1
        self.reserved_total -= 1

    def unreserve(self, c: int) -> None:
        """Nobody of class ``c`` waits any more: its reserved slots are anyone's."""
        self.reserved_total -= self.reserved[c]
        self.reserved[c] = 0

    def need(self, c: int, queued: int) -> int:
        """How many more slots class ``c`` needs, with ``queued`` of it waiting."""
        return queued - self.incoming[c] - self.reserved[c]

    def check(self, live: Iterable[Request]) -> None:
        incoming = [0] * len(self.incoming)
        for r in live:
            if r.claimed_for is not None:
                incoming[r.claimed_for] += 1
        assert incoming == self.incoming, (incoming, self.incoming)
        assert self.reserved_total == sum(self.reserved), (self.reserved_total, self.reserved)
        for rid, r in self.drains.items():
            assert r.claimed_for is not None, f"{rid} drains for nobody"
