"""Priority inheritance: a request that others depend on runs at the most
urgent class among its live waiters (and drops back when they end).

A mixin of :class:`~laneway.core.scheduler.Scheduler`.
"""

from __future__ import annotations

from laneway.core.request import Request, State

_QUEUED = State.QUEUED
_RUNNING = State.RUNNING


class Inheriting:
    __slots__ = ()  # the scheduler's attributes are slots (see Scheduler)

    def _inherit(self, req: Request) -> None:
        """Link ``req`` to what it depends on, and to what already waits for it."""
        for dep_id in req.depends_on:
            dep = self._reqs.get(dep_id)
            if dep is None:  # not submitted yet (or already ended): remember the wait
                self._awaited.setdefault(dep_id, set()).add(req.id)
                continue
            if dep.waiters is None:
                dep.waiters = set()
            dep.waiters.add(req.id)
            self._reclass(dep, set())
        waiters = self._awaited.pop(req.id, None)
        if waiters:
            req.waiters = (req.waiters or set()) | waiters
            self._reclass(req, set())

    def _reclass(self, req: Request, seen: set[str]) -> None:
        """Set ``req``'s effective class from its own and its live waiters'."""
        if req.id in seen:
            return
        seen.add(req.id)
        target = req.priority
        for wid in req.waiters or ():
            waiter = self._reqs.get(wid)
            if waiter is not None and waiter.cls < target:
                target = waiter.cls
        req.inherited = target if target != req.priority else None
        if target != req.cls:
            self._changes += 1  # preemptibility may change: victim searches look again
            c = req.claimed_for
            if c is not None and req.state is _RUNNING and target not in self._victims[c]:
                # a drain claim on it lapses: its claimant may not preempt it any more
                req.claimed_for = None
                self._incoming[c] -= 1
                self._drains.pop(req.id, None)
            if req.state is _QUEUED:
                self.lanes.take(req)
                req.cls = target
                self.lanes.push(req)
            else:
                run = self._running[req.cls].pop(req.id)
                self._end_sum[req.cls] -= req.expected_end_s
                req.cls = target
                self._running[target][req.id] = run
                self._end_sum[target] += req.expected_end_s
            for dep_id in req.depends_on:
                dep = self._reqs.get(dep_id)
                if dep is not None:
                    self._reclass(dep, seen)
