"""Urgent work stops batch work where its prompt is cached, rather than start elsewhere.

With placement by prefix (:mod:`laneway.core.prefix_spread`), a request goes where its
prompt is likely cached if that worker has a free slot and the prefill its cache saves
outweighs the requests it would run beside there. Under a
batch flood the worker holding an agent's prompt is often full of batch work while
another has a slot: the agent's next turn then starts there, pays the whole prefill
again (seconds on a CPU engine, against a fraction of one where the prompt is cached),
and its prompt comes to be cached on every engine, where the engines' caches evict one
another's prompts.

So a request of a class that may preempt, whose prompt the full worker holds (at least
half of it), stops a request there that it may preempt (the least urgent class there,
then the least work lost: :func:`~laneway.core.victims.choose_victim`) and waits for that
slot, the one stop only — a stop takes an abort or a checkpoint, not a run's end; one
not done within :data:`STOP_WAIT_S` is waited for no longer — when
that worker, with the slot freed, is one placement would choose
(:meth:`SlotPlacement.would_take <laneway.core.placement.SlotPlacement.would_take>`).
Otherwise it starts where a slot is free, as before. A class that may preempt nothing
stops nothing for its cache (batch work waits for its worker's slot instead, while it
has one: :class:`~laneway.core.placement.SlotPlacement`'s ``patient``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from laneway.core.decisions import Decision
from laneway.core.request import Request, State
from laneway.core.victims import choose_victim

if TYPE_CHECKING:
    from laneway.core.placement import SlotPlacement
    from laneway.core.preemption import Preemptor
    from laneway.core.promises import Promises

_PREEMPTED = State.PREEMPTED
STOP_WAIT_S = 1.0  # how long a request waits for a stop made for its cache, at most


def _stopping(victim: Request) -> bool:
    """Whether ``victim``'s stop is still under way (its slot not yet free)."""
    return victim.claimed_for is not None and victim.state is _PREEMPTED


def _waited(victim: Request, now: float) -> bool:
    """Whether ``victim``'s stop is still waited for (under way, for less than
    :data:`STOP_WAIT_S`)."""
    return _stopping(victim) and now < victim.preempt_at_s + STOP_WAIT_S


class AffinityStops:
    """Stops made for a waiting request's cache, and the waits for them."""

    __slots__ = ("placement", "preemptor", "promises", "stopped", "victims")

    def __init__(
        self,
        placement: SlotPlacement,
        preemptor: Preemptor,
        promises: Promises,
        victims: tuple[tuple[int, ...], ...],
    ) -> None:
        self.placement = placement
        self.preemptor = preemptor
        self.promises = promises
        self.victims = victims  # per class: the classes it may preempt
        # victims stopped for a waiting request's cache (its id), until their slot frees
        self.stopped: list[tuple[Request, str]] = []

    def pending(self, cls: int, now: float) -> bool:
        """Whether a request of class ``cls`` waits for a stop made for its cache."""
        return any(v.claimed_for == cls and _waited(v, now) for v, _ in self.stopped)

    def next_due(self, now: float) -> float:
        """When the next wait for a stop ends (inf: none)."""
        ends = [v.preempt_at_s + STOP_WAIT_S for v, _ in self.stopped if _waited(v, now)]
        return min(ends, default=math.inf)

    def waits(self, req: Request, now: float, out: list[Decision]) -> bool:
        """Whether ``req`` waits (not started now though a slot may be free): a stop made
        for it is under way, or one is made now on the worker holding its prompt."""
        if self.stopped:  # (a victim's claim ends as its slot frees, held for its class)
            self.stopped = [(v, rid) for v, rid in self.stopped if _stopping(v)]
            made = [v for v, rid in self.stopped if rid == req.id]
            if made:  # (waited for, or given up on: then it starts where it may, no other stop)
                return any(_waited(v, now) for v in made)
        mine = self.victims[req.cls]
        if not mine or not req.prefix:
            return False
        w = self.placement.would_take(req, now)
        if w is None:
            return False
        pre = self.preemptor
        victim = choose_victim(
            [c for c in pre.candidates(mine, req.model, now, req.cls) if c.worker_id == w.id]
        )
        if victim is None:
            return False
        v = pre.reqs[victim.request_id]
        self.promises.claim(v, req.cls)
        pre.stop(v, pre.cheapest_mode(v, now), req.cls, now, out)
        self.stopped.append((v, req.id))
        return True
