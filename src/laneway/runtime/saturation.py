"""How much an upstream engine can take: a saturation gate and an adapted concurrency.

``slots`` of an upstream is a guess: too low leaves the engine idle, too high lets the
engine queue requests of its own, where laneway's priorities no longer apply (an urgent
request waits behind batch work inside vLLM). So at every probe laneway reads the
engine's own gauges (``/metrics``: requests running, waiting in its queue, the share of
its KV cache in use; :meth:`~laneway.backends.base.Worker.engine_state`) and sets how many
requests it sends that engine at once — between ``min_slots`` and ``slots`` — the way TCP
sets a window (additive increase, multiplicative decrease):

- **it queues** (requests wait in its own queue): laneway's requests that it runs —
  those laneway has there less those waiting — are what it takes at once, and that is
  the new limit (halved where that cannot be told: the queue is not laneway's). The
  requests over it that have made nothing yet are taken back into laneway's queues
  (:meth:`~laneway.runtime.recovery.Recovery.take_back`), where priority holds;
  those that have begun are left to end;
- **its KV cache is full** (:data:`KV_FULL` used): the limit halves;
- either way (never under ``min_slots``) the limit it was cut to is its **ceiling**: it
  grows back to it, but past it only once every :data:`REPROBE` readings, to find whether
  the engine takes more now;
- **not saturated, and every allowed slot in use**: the limit grows by one (to ``slots``
  at most, to the ceiling while one holds), so an engine that can take more gets more.

The engine is read at every probe, and soon (:data:`QUICK_READ_S`) after laneway sends it
more than it has yet seen it run without queueing, so that a burst sent to an engine of
unknown size is gated within a fraction of a second, not a probe later. A reading within
:data:`SETTLE_S` of a cut may not cut again: the engine's gauges lag the requests taken
back from it.

An engine that says nothing (no ``/metrics``, or none of these gauges) keeps ``slots``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from laneway.backends.base import EngineState

log = logging.getLogger("laneway.runtime")

KV_FULL = 0.95  # the share of its KV cache in use past which an engine is saturated
REPROBE = 30  # readings at the ceiling (a minute at the default probe interval) before one past it
QUICK_READ_S = 0.25  # after sending an engine more than it was seen to run: read it this soon
SETTLE_S = 1.0  # after a cut: readings that may not cut again (its gauges lag)


@dataclass
class Window:
    """One upstream's adapted concurrency."""

    slots: int  # the most it is given (configured)
    floor: int  # the least it is given (configured: min_slots)
    limit: int  # what it may run now
    saturated: bool = False
    seen: EngineState | None = None  # what its engine said last
    ceiling: int | None = None  # the limit it was last cut to: it grows past it only to re-probe
    proven: int = 0  # the most laneway ran there with its engine keeping up
    since_cut: int = 0  # readings since the last cut
    cut_at: float = -math.inf  # when the limit was last cut
    take_back: int = 0  # after a cut: how many of the requests over it to take back (at most)

    def observe(self, state: EngineState, in_flight: int, now: float) -> int:
        """The limit after the engine said ``state`` while laneway ran ``in_flight`` there."""
        self.seen = state
        full = state.kv_usage is not None and state.kv_usage >= KV_FULL
        self.saturated = state.waiting > 0 or full
        self.take_back = 0
        if self.saturated:
            if now - self.cut_at < SETTLE_S:  # (its gauges may not show the last cut yet)
                return self.limit
            ran = in_flight - state.waiting  # laneway's requests it runs (if all that waits is laneway's)
            cut = ran if state.waiting > 0 and 0 < ran < self.limit else self.limit // 2
            self.limit = max(self.floor, min(cut, self.limit))
            self.ceiling = self.limit
            self.proven = min(self.proven, self.limit)
            self.since_cut = 0
            self.cut_at = now
            self.take_back = min(state.waiting, max(in_flight - self.limit, 0))
            return self.limit
        self.since_cut += 1
        self.proven = max(self.proven, min(in_flight, state.running))
        if in_flight >= self.limit and self.limit < self.slots:
            if self.ceiling is None or self.limit < self.ceiling:
                self.limit += 1
            elif self.since_cut >= REPROBE:  # past the ceiling, now and then: does it take more?
                self.limit += 1
                self.ceiling = None
        return self.limit

    def unproven(self, in_flight: int) -> bool:
        """Whether laneway runs more there than it has seen the engine run without queueing."""
        return in_flight > self.proven and (self.ceiling is None or in_flight > self.ceiling)


class Saturation:
    """The windows of a server's upstream workers (those that adapt)."""

    def __init__(self, windows: dict[str, Window]) -> None:
        self.windows = windows

    def observe(self, name: str, state: EngineState | None, in_flight: int, now: float) -> int | None:
        """Worker ``name``'s new limit if it changed (``None``: it did not, or it does not
        adapt, or its engine said nothing)."""
        w = self.windows.get(name)
        if w is None or state is None:
            return None
        before = w.limit
        after = w.observe(state, in_flight, now)
        if after == before:
            return None
        if after < before:
            log.info(
                "worker %s: its engine is saturated (%d running, %d waiting, KV %s): %d at once, was %d",
                name,
                state.running,
                state.waiting,
                "unknown" if state.kv_usage is None else f"{state.kv_usage:.0%}",
                after,
                before,
            )
        return after
