"""The dispatch step: queued requests start while slots are free.

Each round takes the request the policy's order picks (:mod:`laneway.core.selection`),
asks the placement for a worker (:mod:`laneway.core.placement`), and either starts it
there (a :class:`~laneway.core.decisions.Dispatch`) or, not now, leaves its lane blocked
for this step — on a GPU fleet after asking for the loads that would serve it
(:mod:`laneway.core.loads`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from laneway.core.affinity import AffinityStops
from laneway.core.decisions import Decision, Dispatch
from laneway.core.fairness import FairShares
from laneway.core.feedback import TimeSlices
from laneway.core.holds import Holds
from laneway.core.isolation import Isolation
from laneway.core.lanes import Lanes
from laneway.core.measures import Calibration
from laneway.core.occupancy import Occupancy
from laneway.core.prefill_guard import PrefillGuard
from laneway.core.promises import Promises
from laneway.core.request import TRANSITIONS, State, transition
from laneway.core.selection import NONE_BLOCKED, Selector, select_strict
from laneway.core.stats import Counters
from laneway.core.tables import Tables

if TYPE_CHECKING:
    from laneway.core.loads import ModelLoads

_RUNNING = State.RUNNING
_NEXT = TRANSITIONS
_new_tuple = tuple.__new__  # builds a named tuple without the Python-level __new__


class Dispatcher:
    __slots__ = (
        "affinity",
        "calibration",
        "counters",
        "fair",
        "feedback",
        "guard",
        "holds",
        "interval_s",
        "isolation",
        "lanes",
        "loads",
        "occ",
        "placement",
        "preemptible",
        "promises",
        "selector",
        "shares",
        "slices",
    )

    def __init__(
        self,
        tables: Tables,
        lanes: Lanes,
        occ: Occupancy,
        promises: Promises,
        selector: Selector,
        fair: FairShares | None,
        calibration: Calibration,
        counters: Counters,
        slices: TimeSlices,
        loads: ModelLoads | None,
        holds: Holds,
        isolation: Isolation | None = None,
        affinity: AffinityStops | None = None,
        guard: PrefillGuard | None = None,
    ) -> None:
        self.lanes = lanes
        self.occ = occ
        self.placement = occ.placement
        self.promises = promises
        self.selector = selector
        self.fair = fair
        self.calibration = calibration
        self.counters = counters
        self.slices = slices  # (time slices start with each run: mlfq)
        self.feedback = tables.feedback
        self.loads = loads  # (GPU fleets: loads planned for what no worker can take)
        self.shares = tables.shares
        self.interval_s = tables.interval_s
        self.preemptible = tables.preemptible
        self.holds = holds  # (free slots kept a moment for the class that freed them)
        self.isolation = isolation  # (workers that run urgent work alone)
        self.affinity = affinity  # (urgent work stops batch work where its prompt is cached)
        self.guard = guard  # (an urgent long prefill with none beside it)

    def step(self, now: float, out: list[Decision]) -> None:
        """Start queued requests while slots are free (or loads may be planned)."""
        blocked: set[int] = NONE_BLOCKED
        lanes = self.lanes
        occ = self.occ
        loads = self.loads
        placement = self.placement
        counters = self.counters
        holds = self.holds
        if holds.count:
            holds.lapse(now)
        while (occ.free > 0 or loads is not None) and lanes.total:
            if self.promises.reserved_total:
                req = self.selector.reserved_head(now, blocked) or self.selector.select(now, blocked)
            elif self.shares:
                req = self.selector.select(now, blocked)
            else:  # selector.select, inline: the hot path
                req = select_strict(lanes, now, blocked, self.interval_s)
            if req is None:
                return
            if holds.count and occ.free <= holds.against(req.cls):  # (the free slots are held)
                if blocked is NONE_BLOCKED:
                    blocked = set()
                blocked.add(req.lane)
                continue
            # (where models load, the loop goes on with no slot free: loads may be planned)
            if self.affinity is not None and req.prefix and self.affinity.waits(req, now, out):
                return  # (it waits for the slot of a request stopped where its prompt is: none passes it)
            w = placement.take_slot(req, now) if loads is None or occ.free > 0 else None
            if w is None:
                if loads is not None:
                    loads.plan(req, now, out)
                if blocked is NONE_BLOCKED:
                    blocked = set()
                blocked.add(req.lane)
                continue
            lanes.pop_head(req, now)
            if _RUNNING not in _NEXT[req.state]:  # transition(req, _RUNNING), inline: the hot path
                transition(req, _RUNNING)
            req.state = _RUNNING
            if req.first_start_s != req.first_start_s:  # NaN: never started
                req.first_start_s = now
                if req.est_raw_s == req.est_raw_s:  # an estimate to learn from
                    self.calibration.learn(req.priority, req.est_raw_s, now - req.arrival_s)
                    self.calibration.started(req, now - req.arrival_s)
            else:
                counters.resumed += 1
            req.started_s = now
            if req.tenant is not None and self.fair is not None:  # (others' tags are arrivals)
                self.fair.dispatched(req)
            occ.start(req, w, now)
            if self.isolation is not None:
                self.isolation.start(req, w)
            if self.guard is not None:
                self.guard.start(req, w)
            if loads is not None:  # (and the LoRA adapter loads it needs: before its dispatch)
                loads.touch(w.id, now, out)
            counters.dispatched += 1
            if holds.count:
                holds.use(req.priority)
            out.append(_new_tuple(Dispatch, (req.id, w.id, req.resume)))  # Dispatch(rid, wid, req.resume)
            if self.feedback and self.preemptible[req.cls]:
                self.slices.start(req, now)
