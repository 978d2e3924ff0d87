"""Slots kept a moment for the class that just freed them (anticipation).

A client of an urgent class often sends its next request as soon as its last one ends (an
agent's next step, a chat's next turn). Were the freed slot given at once to queued batch
work, that request would preempt it a few milliseconds later: the batch request's start is
lost (on an engine, the prefill it began; with it, cache space), and the urgent one shares
its first step with it. So when a request of a class that may preempt others ends, its slot
is kept for that class for ``hold_s`` (the scheduler's ``hold_s``): in that time only
requests the class may not preempt take it (its own class, more urgent ones, any class it
has no rights over). The first request of the class that starts uses the hold; otherwise
it lapses and the slot is anyone's. Anticipatory disk scheduling (Iyer and Druschel, 2001)
waits the same way for a process's next read.

Holds count against the free slots only: a held slot is never one that runs something.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence


class Holds:
    __slots__ = ("count", "hold_s", "rights_of", "until")

    def __init__(self, rights_of: Sequence[frozenset[int]], hold_s: float = 0.0) -> None:
        self.rights_of = rights_of  # per class rank: the ranks it may preempt
        self.hold_s = hold_s  # (0: nothing is ever held)
        self.until: list[deque[float]] = [deque() for _ in rights_of]  # per class, oldest first
        self.count = 0

    def freed(self, cls: int, now: float) -> None:
        """A request of class ``cls`` ended at ``now``: its slot is kept for the class for
        ``hold_s`` if the class may preempt anyone (else nothing is kept from anyone)."""
        if self.rights_of[cls]:
            self.hold(cls, now + self.hold_s)

    def hold(self, cls: int, until_s: float) -> None:
        """A slot freed by class ``cls`` is kept for it until ``until_s``."""
        self.until[cls].append(until_s)
        self.count += 1

    def lapse(self, now: float) -> None:
        """Holds whose time is up are dropped."""
        for q in self.until:
            while q and q[0] <= now:
                q.popleft()
                self.count -= 1

    def against(self, cls: int) -> int:
        """How many free slots a request of class ``cls`` may not take: those held for the
        classes that may preempt it."""
        return sum(len(q) for c, q in enumerate(self.until) if q and cls in self.rights_of[c])

    def use(self, cls: int) -> None:
        """A request of class ``cls`` started: the hold of its class that ends first is used."""
        q = self.until[cls]
        if q:
            q.popleft()
            self.count -= 1

    def next_lapse(self) -> float:
        """When the next hold lapses (inf: none held)."""
        return min((q[0] for q in self.until if q), default=float("inf"))

    def check(self) -> None:
        assert self.count == sum(len(q) for q in self.until), (self.count, self.until)
        assert self.count >= 0
