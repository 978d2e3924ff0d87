"""Scheduling on GPU fleets: model loads and evictions, the timers placement
needs, and wait estimates per model.

A mixin of :class:`~laneway.core.scheduler.Scheduler`, used when its
placement is a :class:`~laneway.core.gpu_placement.GpuPlacement`.
"""

from __future__ import annotations

import math

from laneway.core.decisions import Decision, Evict
from laneway.core.errors import LanewayError
from laneway.core.estimate import wait_estimate
from laneway.core.request import Request


class GpuScheduling:
    __slots__ = ()  # the scheduler's attributes are slots (see Scheduler)

    def _plan_load(self, req: Request, now: float, out: list[Decision]) -> None:
        """Ask the GPU placement for loads (and evictions) that would serve ``req``."""
        assert self._planner is not None
        for d in self._planner.plan(req, now, self.lanes.model_queued, now - req.arrival_s):
            if type(d) is Evict:
                w = self.workers.pop(d.replica_id)
                self._free -= w.free
                self.slots -= w.spec.slots
                self._changes += 1
            else:
                self.counters.model_loads += 1
            out.append(d)

    def _gpu_wakeup(self) -> float:
        """When placement may answer differently with nobody acting: an idle
        replica becomes evictable (idle for its load time), a drain lapses, a
        waiting request reaches the switch bound."""
        assert self._planner is not None
        now = self._now
        t = math.inf
        for r in self._planner.replicas.values():
            if r.draining > now:
                t = min(t, r.draining)
            if r.idle:
                evictable_at = r.last_used + r.model.load_s
                if evictable_at > now:
                    t = min(t, evictable_at)
        switch = self._planner.switch_wait_s
        lanes = self.lanes
        for lane, n in enumerate(lanes.count):
            if n:
                head = lanes.head(lane)
                if head is not None and head.arrival_s + switch > now:
                    t = min(t, head.arrival_s + switch)
        return t

    def loaded(self, replica_id: str, now: float) -> None:
        """The runtime finished loading a replica: its slots take work from now on."""
        if self._planner is None:
            raise LanewayError("this scheduler's placement does not load models")
        w = self._planner.loaded(replica_id, now)
        self.workers[w.id] = w
        self._free += w.free
        self.slots += w.spec.slots
        self._changes += 1

    def _estimate_on_gpus(self, cls: int, model: str, now: float) -> float:
        """The wait for ``model``'s replicas: its queue ahead over its slots, after
        the rest of a load when no replica of it is ready."""
        assert self._planner is not None
        spec = self._planner.inv.models.get(model)
        if spec is None:
            return 0.0
        reps = self._planner.by_model.get(model, [])
        ready = [r for r in reps if r.ready]
        cold = 0.0
        if not ready:
            loading = [r.ready_at for r in reps if not r.ready]
            cold = max(min(loading) - now, 0.0) if loading else spec.load_s
        slots = sum(r.model.slots for r in ready) or spec.slots
        running = sum(len(r.worker.running) for r in ready)
        free = sum(r.worker.free for r in ready if not r.draining)
        lanes = self.lanes
        m = lanes.models.get(model)
        ahead = 0
        if m is not None:
            base = m * lanes.width
            ahead = sum(lanes.count[base : base + (cls + 1) * lanes.levels])
        mean = self.service.mean(cls, model)
        return cold + wait_estimate(
            slots=slots,
            available=free,
            ahead=ahead,
            ahead_work_s=ahead * mean,
            blocking=running,
            blocking_remaining_s=running * mean / 2,
            mean_service_s=mean,
            urgent_load=0.0,
        )
