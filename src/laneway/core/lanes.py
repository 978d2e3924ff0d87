"""The queued requests: one FIFO heap per lane, with lazy deletion.

A lane is ``(class, level)``: the effective class (after priority
inheritance) and the multi-level-feedback level (always 0 unless the policy
uses feedback). Under ``fifo`` there is a single lane. Inside a lane the order
is the total order ``(arrival_s, seq)``; a preempted request keeps its arrival
time and so goes back to the head of its class.

Removal is lazy: a heap entry carries the request's generation, and an entry
whose generation or state no longer matches is dropped when it reaches the top.
"""

from __future__ import annotations

import heapq

from laneway.core.request import Request, State

_QUEUED = State.QUEUED

Entry = tuple[float, int, int, Request]


class Lanes:
    def __init__(self, n_classes: int, levels: int, single: bool) -> None:
        self.n_classes = n_classes
        self.levels = levels
        self.single = single
        n = 1 if single else n_classes * levels
        self.heaps: list[list[Entry]] = [[] for _ in range(n)]
        self.count = [0] * n  # valid entries per lane
        self.class_count = [0] * n_classes  # queued per effective class
        self.hint_work = [0.0] * n_classes  # sum of service hints per class
        self.hint_count = [0] * n_classes
        self.total = 0

    def lane_of(self, req: Request) -> int:
        if self.single:
            return 0
        return req.cls * self.levels + req.level

    def push(self, req: Request) -> None:
        c = req.cls
        lane = 0 if self.single else c * self.levels + req.level
        req.gen += 1
        heapq.heappush(self.heaps[lane], (req.arrival_s, req.seq, req.gen, req))
        self.count[lane] += 1
        self.class_count[c] += 1
        self.total += 1
        if req.est_service_s is not None:
            self.hint_work[c] += req.est_service_s
            self.hint_count[c] += 1

    def head(self, lane: int) -> Request | None:
        heap = self.heaps[lane]
        while heap:
            _, _, gen, req = heap[0]
            if req.gen == gen and req.state is _QUEUED:
                return req
            heapq.heappop(heap)
        return None

    def take(self, req: Request) -> None:
        """Remove a queued request (dispatched, expired, shed or cancelled)."""
        c = req.cls
        lane = 0 if self.single else c * self.levels + req.level
        self.count[lane] -= 1
        self.class_count[c] -= 1
        self.total -= 1
        if req.est_service_s is not None:
            self.hint_work[c] -= req.est_service_s
            self.hint_count[c] -= 1
        req.gen += 1  # its heap entry is now stale
        heap = self.heaps[lane]
        if heap and heap[0][3] is req:
            heapq.heappop(heap)

    def lanes_of_class(self, cls: int) -> range:
        if self.single:
            return range(1)
        return range(cls * self.levels, (cls + 1) * self.levels)

    def queued_in(self, lanes: range) -> int:
        return sum(self.count[i] for i in lanes)

    def iter_class(self, cls: int) -> list[Request]:
        """Valid queued requests of effective class ``cls`` in dispatch order (O(n log n))."""
        out: list[Request] = []
        for lane in self.lanes_of_class(cls):
            for entry in sorted(self.heaps[lane]):
                req = entry[3]
                if req.gen == entry[2] and req.state is _QUEUED and req.cls == cls:
                    out.append(req)
        out.sort(key=lambda r: (r.level, r.arrival_s, r.seq))
        return out
