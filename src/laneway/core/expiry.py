"""Queue timeouts and overload shedding over never-started requests.

Per native class, a deque of requests that have not started yet, in arrival
order. Requests using their class's default timeout therefore have
non-decreasing deadlines along the deque, so expiry is a scan from the left;
requests with their own timeout go to a heap as well. Shedding takes the
newest from the right. A request that has started once (and was preempted)
is never expired: it was accepted into work and being preempted is not its
fault.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from laneway.core.request import Request, State

_QUEUED = State.QUEUED


def _fresh(req: Request) -> bool:
    return req.state is _QUEUED and math.isnan(req.first_start_s)


class Expiry:
    def __init__(self, class_timeouts: list[float | None], enabled: bool = True) -> None:
        self.enabled = enabled
        self.timeouts = class_timeouts if enabled else [None] * len(class_timeouts)
        self.fresh: list[deque[Request]] = [deque() for _ in class_timeouts]
        self.custom: list[tuple[float, int, Request]] = []
        self.next_due = math.inf  # no deadline falls before this: due() has nothing

    def add(self, req: Request, now: float) -> None:
        """Set ``req.deadline_s`` and track it."""
        own = req.timeout_s
        default = self.timeouts[req.priority]
        self.fresh[req.priority].append(req)
        if own is None or not self.enabled:
            req.deadline_s = math.inf if default is None else req.arrival_s + default
            if req.deadline_s < self.next_due:
                self.next_due = req.deadline_s
        else:
            req.deadline_s = req.arrival_s + own
            if math.isfinite(own):
                heapq.heappush(self.custom, (req.deadline_s, req.seq, req))
                if req.deadline_s < self.next_due:
                    self.next_due = req.deadline_s

    def due(self, now: float) -> list[Request]:
        """Never-started queued requests whose deadline has passed."""
        out: list[Request] = []
        for cls, dq in enumerate(self.fresh):
            limit = self.timeouts[cls]
            if limit is None:
                while dq and not _fresh(dq[0]):
                    dq.popleft()
                continue
            while dq:
                req = dq[0]
                if not _fresh(req):
                    dq.popleft()
                elif req.arrival_s + limit <= now:
                    dq.popleft()  # custom-timeout requests are the heap's concern
                    if req.timeout_s is None:
                        out.append(req)
                else:
                    break
        heap = self.custom
        while heap and heap[0][0] <= now:
            req = heapq.heappop(heap)[2]
            if _fresh(req):
                out.append(req)
        self.next_due = self.next_deadline()
        return out

    def next_deadline(self) -> float:
        """The earliest deadline of a request that could still expire (inf: none)."""
        best = math.inf
        for cls, dq in enumerate(self.fresh):
            limit = self.timeouts[cls]
            if limit is None:
                continue
            while dq and not _fresh(dq[0]):
                dq.popleft()
            if dq:
                best = min(best, dq[0].arrival_s + limit)
        heap = self.custom
        while heap and not _fresh(heap[0][2]):
            heapq.heappop(heap)
        if heap:
            best = min(best, heap[0][0])
        return best

    def refresh(self) -> float:
        """Drop deadlines of requests that started or ended; the next one left."""
        if self.next_due < math.inf:
            self.next_due = self.next_deadline()
        return self.next_due

    def newest(self, cls: int) -> Request | None:
        """The newest never-started queued request of native class ``cls``."""
        dq = self.fresh[cls]
        while dq:
            req = dq[-1]
            if _fresh(req):
                return req
            dq.pop()
        return None
