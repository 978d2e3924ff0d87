"""Scheduling on GPU fleets: model loads and evictions as decisions, the replicas that
become workers once loaded and stop being ones when evicted, and the times placement may
answer differently with nobody acting.

:class:`ModelLoads` is used when the scheduler's placement is a
:class:`~laneway.core.gpu_placement.GpuPlacement`; the placement chooses (filter, then
score) and this step turns its choices into ``Load`` / ``Evict`` decisions and worker
changes.
"""

from __future__ import annotations

import math

from laneway.core.decisions import Decision, Evict, Load
from laneway.core.errors import LanewayError
from laneway.core.gpu_placement import GpuPlacement
from laneway.core.lanes import Lanes
from laneway.core.occupancy import Occupancy
from laneway.core.request import Request
from laneway.core.stats import Counters


class ModelLoads:
    __slots__ = ("counters", "lanes", "occ", "planner")

    def __init__(self, planner: GpuPlacement, occ: Occupancy, lanes: Lanes, counters: Counters) -> None:
        self.planner = planner
        self.occ = occ
        self.lanes = lanes
        self.counters = counters

    def plan(self, req: Request, now: float, out: list[Decision]) -> None:
        """Ask the GPU placement for loads (and evictions) that would serve ``req``."""
        for d in self.planner.plan(req, now, self.lanes.model_queued, now - req.arrival_s):
            if type(d) is Evict:
                if d.replica_id in self.occ.workers:  # (not one asleep already: it is stopped)
                    self.occ.remove(d.replica_id)
            elif isinstance(d, Load) and not d.wake:
                self.counters.model_loads += 1
            out.append(d)

    def touch(self, worker_id: str, now: float, out: list[Decision]) -> None:
        """A request was placed on ``worker_id``: the adapter loads it needs go out first."""
        planner = self.planner
        planner.touch(worker_id, now)
        if planner.adapters.pending:
            out.extend(planner.adapters.pending)
            planner.adapters.pending.clear()

    def loaded(self, replica_id: str, now: float) -> None:
        """A replica finished loading: its slots take work from now on."""
        self.occ.add(self.planner.loaded(replica_id, now))

    def adopt(self, replica_id: str, model: str, gpus: tuple[str, ...], now: float) -> None:
        """A replica placed before (by a cluster's earlier leader) runs ``model`` on ``gpus``:
        its slots take work from now on."""
        self.planner.adopt(replica_id, model, gpus, now)
        self.loaded(replica_id, now)

    def unloaded(self, replica_id: str) -> None:
        """A replica is gone without an eviction (its load failed, its engine died, maybe asleep)."""
        planner = self.planner
        if replica_id not in planner.replicas and replica_id not in planner.asleep:
            raise LanewayError(f"unknown replica {replica_id!r}")
        if replica_id in self.occ.workers:
            self.occ.remove(replica_id)
        self.planner.drop(replica_id)

    def reload(self, model: str, now: float) -> list[Decision]:
        """Loads of preloaded ``model`` again, with no request waiting for it."""
        out = self.planner.reload(model, now)
        self.counters.model_loads += sum(1 for d in out if type(d) is Load)
        return out

    def wakeup(self, now: float) -> float:
        """When placement may answer differently with nobody acting: an idle
        replica becomes evictable (idle for its load time), a drain lapses, a
        waiting request reaches the switch bound."""
        t = math.inf
        for r in self.planner.replicas.values():
            if r.draining > now:
                t = min(t, r.draining)
            if r.idle:
                evictable_at = r.last_used + r.model.load_s
                if evictable_at > now:
                    t = min(t, evictable_at)
        switch = self.planner.switch_wait_s
        lanes = self.lanes
        for lane, n in enumerate(lanes.count):
            if n:
                head = lanes.head(lane)
                if head is not None and head.arrival_s + switch > now:
                    t = min(t, head.arrival_s + switch)
        return t
