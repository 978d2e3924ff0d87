"""Workers that fail: requeueing what they could not run, taking them out of placement.

A mixin of :class:`~laneway.core.scheduler.Scheduler`.
"""

from __future__ import annotations

from laneway.core.errors import InvalidTransition, LanewayError
from laneway.core.request import State

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
