"""How much an upstream engine can take: a saturation gate and an adapted concurrency.

``slots`` of an upstream is a guess: too low leaves the engine idle, too high lets the
engine queue requests of its own, where laneway's priorities no longer apply (an urgent
request waits behind batch work inside vLLM). So at every probe laneway reads the
engine's own gauges (``/metrics``: requests running, waiting in its queue, the share of
its KV cache in use; :meth:`~laneway.backends.base.Worker.engine_state`) and sets how many
requests it sends that engine at once — between ``min_slots`` and ``slots`` — the way TCP
sets a window (additive increase, multiplicative decrease):

- **saturated** (the engine queues requests, or its KV cache is :data:`KV_FULL` used):
  the limit halves (never under ``min_slots``). Nothing running is stopped: as requests
  end their slots stay withheld, so no more work goes there until it has drained below
  the new limit, and the work waits in laneway's queues, where priority holds;
- **not saturated, and every allowed slot in use**: the limit grows by one (to ``slots``
  at most), so an engine that can take more gets more.

An engine that says nothing (no ``/metrics``, or none of these gauges) keeps ``slots``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from laneway.backends.base import EngineState

log = logging.getLogger("laneway.runtime")

KV_FULL = 0.95  # the share of its KV cache in use past which an engine is saturated


@dataclass
class Window:
    """One upstream's adapted concurrency."""

    slots: int  # the ceiling (configured)
    floor: int  # the least it is given (configured: min_slots)
    limit: int  # what it may run now
    saturated: bool = False
    seen: EngineState | None = None  # what its engine said last

    def observe(self, state: EngineState, in_flight: int) -> int:
        """The limit after the engine said ``state`` while laneway ran ``in_flight`` there."""
        self.seen = state
        full = state.kv_usage is not None and state.kv_usage >= KV_FULL
        self.saturated = state.waiting > 0 or full
        if self.saturated:
            self.limit = max(self.floor, self.limit // 2)
        elif in_flight >= self.limit and self.limit < self.slots:
            self.limit += 1
        return self.limit


class Saturation:
    """The windows of a server's upstream workers (those that adapt)."""

    def __init__(self, windows: dict[str, Window]) -> None:
        self.windows = windows

    def observe(self, name: str, state: EngineState | None, in_flight: int) -> int | None:
        """Worker ``name``'s new limit if it changed (``None``: it did not, or it does not
        adapt, or its engine said nothing)."""
        w = self.windows.get(name)
        if w is None or state is None:
            return None
        before = w.limit
        after = w.observe(state, in_flight)
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
