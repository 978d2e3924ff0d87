"""Queue timeouts and overload shedding over never-started requests.

Per native class, two deques in submission order:

- ``fresh``: every never-started request (shedding takes the newest from the
  right), kept only when ``shedding`` is on (the scheduler sheds only under a
  total queue bound);
- ``scan``: those on the class's default timeout whose deadlines come in
  order, so expiry is a scan from the left.

Requests with their own timeout, and default-timeout requests submitted out of
arrival order (their deadline falls before one already in ``scan``), go to a
heap instead. A request that has started once (and was preempted) is never
expired: it was accepted into work and being preempted is not its fault. One whose
worker failed before it produced anything, queued again (``again``), waits anew: its
queue timeout counts from then, in a heap of its own, until it starts again.
Entries are dropped lazily once their request started or ended.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from laneway.core.request import Request, State

_QUEUED = State.QUEUED
_SHED_SCAN = 64


def _fresh(req: Request) -> bool:
    return req.state is _QUEUED and math.isnan(req.first_start_s)


def _retried(req: Request, deadline: float) -> bool:
    """Whether ``req`` is still queued since its last failed run, with ``deadline`` (not
    started again since: a later stop of a later run is a preemption, never expired)."""
    return req.state is _QUEUED and req.started_s != req.started_s and req.deadline_s == deadline


class Expiry:
    def __init__(
        self, class_timeouts: list[float | None], enabled: bool = True, *, shedding: bool = True
    ) -> None:
        self.enabled = enabled
        self.shedding = shedding  # keep ``fresh`` for :meth:`newest`
        self.timeouts = class_timeouts if enabled else [None] * len(class_timeouts)
        self.fresh: list[deque[Request]] = [deque() for _ in class_timeouts]
        self.scan: list[deque[Request]] = [deque() for _ in class_timeouts]
        self.custom: list[tuple[float, int, Request]] = []
        # queued again after a failed run (no run under way: ``started_s`` NaN): (deadline, seq, request)
        self.retried: list[tuple[float, int, Request]] = []
        self.next_due = math.inf  # no deadline falls before this: due() has nothing
        self.stale = False  # next_due may belong to a request no longer waiting

    def add(self, req: Request, now: float) -> None:
        """Set ``req.deadline_s`` and track it."""
        own = req.timeout_s
        cls = req.priority
        default = self.timeouts[cls]
        if self.shedding:
            fresh = self.fresh[cls]
            while fresh:  # amortised trim: classes without deadlines too
                head = fresh[0]
                if head.state is _QUEUED and head.first_start_s != head.first_start_s:
                    break  # _fresh(head), inline: still queued and never started (NaN)
                fresh.popleft()
            fresh.append(req)
        if own is None or not self.enabled:
            if default is None:
                req.deadline_s = math.inf
                return
            req.deadline_s = deadline = req.arrival_s + default
            scan = self.scan[cls]
            if scan and scan[-1].deadline_s > deadline:
                heapq.heappush(self.custom, (deadline, req.seq, req))  # out of order
            else:
                scan.append(req)
        else:
            req.deadline_s = deadline = req.arrival_s + own
            if not math.isfinite(own):
                return
            heapq.heappush(self.custom, (deadline, req.seq, req))
        if deadline < self.next_due:
            self.next_due = deadline

    def again(self, req: Request, now: float) -> None:
        """``req`` is queued again, its run having failed before producing anything (its
        ``started_s`` NaN: no run under way): it may wait its queue timeout again from
        ``now`` (it is not expired for the time it ran)."""
        own = req.timeout_s
        limit = self.timeouts[req.priority] if own is None or not self.enabled else own
        if limit is None or not math.isfinite(limit):
            return
        req.deadline_s = deadline = now + limit
        heapq.heappush(self.retried, (deadline, req.seq, req))
        if deadline < self.next_due:
            self.next_due = deadline

    def due(self, now: float) -> list[Request]:
        """Queued requests whose deadline has passed: never started, or queued again
        after a failed run (:meth:`again`)."""
        out: list[Request] = []
        for scan in self.scan:
            while scan:
                req = scan[0]
                if not _fresh(req):
                    scan.popleft()
                elif req.deadline_s <= now:
                    scan.popleft()
                    out.append(req)
                else:
                    break
        heap = self.custom
        while heap and heap[0][0] <= now:
            req = heapq.heappop(heap)[2]
            if _fresh(req):
                out.append(req)
        retried = self.retried
        while retried and retried[0][0] <= now:
            deadline, _, req = heapq.heappop(retried)
            if _retried(req, deadline):
                out.append(req)
        self.next_due = self.next_deadline()
        return out

    def next_deadline(self) -> float:
        """The earliest deadline of a request that could still expire (inf: none)."""
        best = math.inf
        for scan in self.scan:
            while scan:
                head = scan[0]
                if head.state is _QUEUED and head.first_start_s != head.first_start_s:
                    if head.deadline_s < best:  # _fresh(head), inline
                        best = head.deadline_s
                    break
                scan.popleft()
        heap = self.custom
        while heap and not _fresh(heap[0][2]):
            heapq.heappop(heap)
        if heap and heap[0][0] < best:
            best = heap[0][0]
        retried = self.retried
        while retried and not _retried(retried[0][2], retried[0][0]):
            heapq.heappop(retried)
        if retried and retried[0][0] < best:
            best = retried[0][0]
        return best

    def refresh(self) -> float:
        """The next deadline, after dropping those of requests that started or
        ended if one of them held the earliest (the scheduler sets ``stale``)."""
        if self.stale:
            self.stale = False
            self.next_due = self.next_deadline()
        return self.next_due

    def newest(self, cls: int, above: int | None = None) -> Request | None:
        """The newest never-started queued request of native class ``cls`` whose
        effective class is still less urgent than ``above`` (looking at no more
        than ``_SHED_SCAN`` of the newest; ``None`` unless ``shedding``)."""
        dq = self.fresh[cls]
        while dq and not _fresh(dq[-1]):
            dq.pop()
        for i, req in enumerate(reversed(dq)):
            if i >= _SHED_SCAN:
                break
            if _fresh(req) and (above is None or req.cls > above):
                return req
        return None
