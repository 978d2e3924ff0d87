"""Workers that fail: requeueing what they could not run, taking them out of placement,
and taking in what a scheduler that failed left running on them; slots held for use
outside the scheduler (lent to replicas of a cluster).

A mixin of :class:`~laneway.core.scheduler.Scheduler`.
"""

from __future__ import annotations

from collections.abc import Callable

from laneway.core.errors import InvalidTransition, LanewayError
from laneway.core.request import Request, State
from laneway.core.workers import WorkerState

_RUNNING = State.RUNNING
_PREEMPTED = State.PREEMPTED


class WorkerFailures:
    __slots__ = ()  # the scheduler's attributes are slots (see Scheduler)

    def requeue(self, request_id: str, now: float) -> None:
        """Its worker failed before the request produced anything: queue it again.

        It goes back to the head of its class (it keeps its arrival time) and
        starts afresh on whichever worker it is dispatched to next.
        """
        req = self.get(request_id)
        if req.state is _PREEMPTED:  # the failure came first: the preemption did not happen
            req.preemptions -= 1
            self.counters.preemptions[req.cls] -= 1
        elif req.state is not _RUNNING:
            raise InvalidTransition(f"request {request_id} is {req.state.value}, not running")
        req.state = _PREEMPTED
        req.preempt_at_s = now
        req.resume = None
        self.preempted(request_id, now, tokens_done=0, checkpoint_bytes=0)

    def available_for(self, model: str | None) -> bool:
        """Whether some worker that serves ``model`` is in placement (not taken out)."""
        down = getattr(self.placement, "down", None)
        if not down:
            return True
        return any(w.spec.serves(model) and w.id not in down for w in self.workers.values())

    def set_available(self, worker_id: str, available: bool) -> None:
        """Take a worker out of placement (it is failing) or back in (it recovered).

        Requests it runs are not touched; queued ones wait for other workers
        (an unavailable worker is "not now", never "never").
        """
        w = self.workers.get(worker_id)
        if w is None:
            raise LanewayError(f"unknown worker {worker_id!r}")
        self.placement.set_available(w, available)

    def adopt(self, req: Request, worker_id: str, now: float) -> None:
        """Take in ``req`` as running on ``worker_id`` already (a new scheduler rebuilding
        the state of one that failed): it holds one of the worker's slots from ``now``,
        counts for its tenant, and ends, is preempted or cancelled like any running request."""
        if req.state is not State.NEW:
            raise InvalidTransition(f"request {req.id} was already submitted")
        if req.id in self._reqs:
            raise LanewayError(f"request id {req.id!r} is already live")
        w, take = self._slot_taker(worker_id, "running requests can be taken in")
        if w.free <= 0:
            raise LanewayError(f"worker {worker_id} has no free slot for {req.id}")
        req.seq = self._seq
        self._seq += 1
        cls = req.cls = req.priority
        req.est_s = req.est_service_s if req.est_service_s is not None else self.service.mean(cls, req.model)
        req.state = State.RUNNING
        req.first_start_s = req.started_s = now
        req.worker = worker_id
        take(w)
        w.running[req.id] = req
        self._free -= 1
        self._running[cls][req.id] = req
        req.expected_end_s = now + max(req.est_s - req.run_s, 0.0)
        self._end_sum[cls] += req.expected_end_s
        self._changes += 1
        self._reqs[req.id] = req
        if req.tenant is not None:
            self.admission.on_admit(req.tenant)
            self.admission.on_dequeue(req.tenant)

    def hold(self, worker_id: str, n: int) -> None:
        """Hold ``n`` slots of ``worker_id`` (in all, not more) out of this scheduler's
        hands: in use elsewhere, e.g. lent to a replica of a cluster that starts requests
        on them itself. Held slots are neither free nor running; holding more takes free
        ones only. Estimates count them as available (whoever holds them gives them back
        when asked)."""
        w, take = self._slot_taker(worker_id, "slots can be held")
        if n < 0:
            raise LanewayError(f"cannot hold {n} slots")
        more = n - w.held
        if more > w.free:
            raise LanewayError(f"worker {worker_id} has {w.free} free slots, not {more}")
        for _ in range(more):
            take(w)
        for _ in range(-more):
            self.placement.free_slot(w)
        w.held = n
        self._free -= more
        self._held += more
        self._changes += 1

    def _slot_taker(self, worker_id: str, what: str) -> tuple[WorkerState, Callable[[WorkerState], None]]:
        """``worker_id``'s state and the placement's way to take one of its slots."""
        w = self.workers.get(worker_id)
        if w is None:
            raise LanewayError(f"unknown worker {worker_id!r}")
        take = getattr(self.placement, "take", None)
        if take is None:
            raise LanewayError(f"{what} only with slot placement")
        return w, take
