"""Priority inheritance: a request that others depend on runs at the most urgent class
among its live waiters (and drops back when they end).

:class:`Inheritance` owns who waits for what (among them, waits for requests not
submitted yet); a request's effective class (``cls``) changes only here, moving it between
lanes or between the occupancy's classes.
"""

from __future__ import annotations

from collections.abc import Mapping

from laneway.core.lanes import Lanes
from laneway.core.occupancy import Occupancy
from laneway.core.promises import Promises
from laneway.core.request import Request, State

_QUEUED = State.QUEUED
_RUNNING = State.RUNNING


class Inheritance:
    __slots__ = ("awaited", "lanes", "occ", "promises", "reqs", "victims")

    def __init__(
        self,
        reqs: Mapping[str, Request],
        lanes: Lanes,
        occ: Occupancy,
        promises: Promises,
        victims: tuple[tuple[int, ...], ...],
    ) -> None:
        self.reqs = reqs
        self.lanes = lanes
        self.occ = occ
        self.promises = promises
        self.victims = victims
        self.awaited: dict[str, set[str]] = {}  # ids not yet submitted -> live waiters

    def inherit(self, req: Request) -> None:
        """Link ``req`` to what it depends on, and to what already waits for it."""
        for dep_id in req.depends_on:
            dep = self.reqs.get(dep_id)
            if dep is None:  # not submitted yet (or already ended): remember the wait
                self.awaited.setdefault(dep_id, set()).add(req.id)
                continue
            if dep.waiters is None:
                dep.waiters = set()
            dep.waiters.add(req.id)
            self.reclass(dep, set())
        waiters = self.awaited.pop(req.id, None)
        if waiters:
            req.waiters = (req.waiters or set()) | waiters
            self.reclass(req, set())

    def ended(self, req: Request) -> None:
        """``req`` ended: what it depended on drops back to its own waiters' class."""
        for dep_id in req.depends_on:
            dep = self.reqs.get(dep_id)
            if dep is not None and dep.waiters:
                dep.waiters.discard(req.id)
                self.reclass(dep, set())
            awaited = self.awaited.get(dep_id)
            if awaited is not None:
                awaited.discard(req.id)
                if not awaited:
                    del self.awaited[dep_id]

    def reclass(self, req: Request, seen: set[str]) -> None:
        """Set ``req``'s effective class from its own and its live waiters'."""
        if req.id in seen:
            return
        seen.add(req.id)
        target = req.priority
        for wid in req.waiters or ():
            waiter = self.reqs.get(wid)
            if waiter is not None and waiter.cls < target:
                target = waiter.cls
        req.inherited = target if target != req.priority else None
        if target != req.cls:
            self.occ.changes += 1  # preemptibility may change: victim searches look again
            c = req.claimed_for
            if c is not None and req.state is _RUNNING and target not in self.victims[c]:
                self.promises.lapse(req)  # a drain claim lapses: its claimant may not preempt it any more
            if req.state is _QUEUED:
                self.lanes.take(req)
                req.cls = target
                self.lanes.push(req)
            else:
                self.occ.reclass(req, target)
            for dep_id in req.depends_on:
                dep = self.reqs.get(dep_id)
                if dep is not None:
                    self.reclass(dep, seen)
