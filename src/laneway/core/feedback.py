"""Multi-level feedback (the ``mlfq`` policy): time slices for running work.

A request starts at level 0 (or, with a size hint, at the level its size would reach
anyway: :func:`start_level`); each time it uses up its slice (``slice_s x 2^level``) it
drops a level and yields its slot if shorter work of its class is waiting.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from laneway.core.decisions import Decision
from laneway.core.lanes import Lanes
from laneway.core.occupancy import Occupancy
from laneway.core.request import Request, State

if TYPE_CHECKING:
    from laneway.core.preemption import Preemptor

_RUNNING = State.RUNNING
OVERRUN = 1.0  # a time slice preempts a hinted request once it runs past hint x this


def start_level(levels: int, slice_s: float, est_s: float) -> int:
    """The level a request expected to need ``est_s`` starts at: level ``l`` holds work up
    to ``slice x (2^(l+1) - 1)`` seconds of service."""
    top = levels - 1
    level = 0
    while level < top and est_s > slice_s * (2 ** (level + 1) - 1):
        level += 1
    return level


def overran(req: Request, now: float) -> bool:
    """Time slices preempt work the scheduler knew nothing about, or work that ran well
    past its size hint; a request whose hint placed it at its level in the first place is
    left to finish."""
    hint = req.est_service_s
    return hint is None or req.run_s + (now - req.started_s) > OVERRUN * hint


class TimeSlices:
    __slots__ = ("heap", "lanes", "occ", "preemptor", "slice_s")

    def __init__(self, slice_s: float, lanes: Lanes, occ: Occupancy, preemptor: Preemptor) -> None:
        self.slice_s = slice_s
        self.lanes = lanes
        self.occ = occ
        self.preemptor = preemptor
        # (end of its slice, seq, the start of its run, the request)
        self.heap: list[tuple[float, int, float, Request]] = []

    def start(self, req: Request, now: float) -> None:
        """A preemptible request starts a run at its level."""
        heapq.heappush(self.heap, (now + self.slice_s * (2**req.level), req.seq, now, req))

    def next_due(self) -> float:
        return self.heap[0][0]

    def step(self, now: float, out: list[Decision]) -> None:
        """A request past its time slice drops a level and yields its slot if shorter work
        of its class is waiting."""
        heap = self.heap
        lanes = self.lanes
        top = lanes.levels - 1
        while heap and heap[0][0] <= now:
            _, _, started, req = heapq.heappop(heap)
            if req.state is not _RUNNING or req.started_s != started:
                continue
            if req.level < top:
                req.level += 1
            waiting = lanes.waiting_below(req.cls, req.level)
            preemptor = self.preemptor
            if waiting and self.occ.free == 0 and overran(req, now) and preemptor.may_stop(req, now):
                preemptor.promises.claim(req, req.cls)
                preemptor.stop(req, preemptor.cheapest_mode(req, now), req.cls, now, out)
            else:
                heapq.heappush(heap, (now + self.slice_s * (2**req.level), req.seq, started, req))
