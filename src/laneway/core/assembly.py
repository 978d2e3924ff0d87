"""What a :class:`~laneway.core.scheduler.Scheduler` is made of: its parts, each owning its
data, and its steps, each handed the parts it needs (:func:`assemble` builds them once).

Nothing here decides: the scheduler drives the parts this builds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from laneway.core.admission import Admission
from laneway.core.affinity import AffinityStops
from laneway.core.config import SchedulerConfig
from laneway.core.dispatching import Dispatcher
from laneway.core.errors import LanewayError
from laneway.core.estimator import Estimator
from laneway.core.expiry import Expiry
from laneway.core.fairness import FairShares
from laneway.core.feedback import TimeSlices
from laneway.core.gpu_placement import GpuPlacement
from laneway.core.holds import Holds
from laneway.core.inheritance import Inheritance
from laneway.core.isolation import Isolation
from laneway.core.lanes import Lanes
from laneway.core.live import Live
from laneway.core.loads import ModelLoads
from laneway.core.measures import Measures
from laneway.core.modes import PreemptionMode
from laneway.core.occupancy import Occupancy, worker_states
from laneway.core.placement import Placement, SlotPlacement
from laneway.core.policies import PolicySpec
from laneway.core.preemption import Preemptor
from laneway.core.prefill_guard import PrefillGuard
from laneway.core.promises import Promises
from laneway.core.refusal import Refusals
from laneway.core.request import Request
from laneway.core.selection import Selector
from laneway.core.stats import Counters
from laneway.core.tables import Tables
from laneway.core.workers import WorkerSpec


@dataclass(frozen=True, slots=True)
class Parts:
    """A scheduler's state (tables to measures) and its steps (refusals to dispatcher)."""

    tables: Tables
    occupancy: Occupancy
    lanes: Lanes
    promises: Promises
    measures: Measures
    counters: Counters
    admission: Admission
    expiry: Expiry
    reqs: dict[str, Request]
    live_requests: Live
    inheritance: Inheritance
    fair: FairShares | None
    isolation: Isolation | None
    guard: PrefillGuard | None
    loads: ModelLoads | None
    estimator: Estimator
    refusals: Refusals
    preemptor: Preemptor
    slices: TimeSlices
    holds: Holds
    dispatcher: Dispatcher


def assemble(
    workers: Sequence[WorkerSpec], cfg: SchedulerConfig, pol: PolicySpec, placement: Placement | None
) -> Parts:
    """The parts of a scheduler of ``workers`` under ``cfg`` and policy ``pol``, placing by
    ``placement`` (``None``: slots; a :class:`GpuPlacement` loads models)."""
    planner = placement if isinstance(placement, GpuPlacement) else None
    if not workers and planner is None:
        raise LanewayError("at least one worker is required")
    restricted = planner is not None or any(w.classes is not None for w in workers)
    tables = Tables.build(cfg, pol, restricted=restricted)
    k = tables.k
    states = worker_states(workers)
    # (workers that run urgent work alone: under a policy of classes)
    isolation = (
        Isolation(tables.rights_of, tables.victims, cfg.hold_s, list(states.values()), tables.preempting)
        if pol.classes and any(w.isolate for w in workers)
        else None
    )
    spread = pol.spread or cfg.placement
    # (an urgent long prefill with none beside it: placement by prefix over several
    # workers, under a policy that preempts)
    guard = (
        PrefillGuard(tables.victims)
        if cfg.prefill_guard
        and placement is None
        and spread == "prefix"
        and len(states) > 1
        and isolation is None
        and tables.preempting
        else None
    )
    placement = placement or SlotPlacement(
        list(states.values()),
        spread=spread,
        patient=tables.preemptible,
        isolation=isolation,
        guard=guard,
    )
    if planner is not None:  # replicas loaded at start-up take work at once
        for rid, rep in planner.replicas.items():
            if rep.ready:
                states[rid] = rep.worker
    occ = Occupancy(states, placement, k, tables.exposed)
    measures = Measures(k, cfg.costs, cfg.default_service_s, [c.service_s for c in cfg.classes.classes])
    counters = Counters(k)
    admission = Admission(cfg.tenants, cfg.default_tenant, cfg.classes.names)
    # tenants inside a class share by tokens (not under fifo: one queue, an engine's)
    fair = (
        FairShares(
            k,
            {name: p.weight for name, p in cfg.tenants.items()},
            prompt_weight=cfg.fair_prompt_weight,
            output_weight=cfg.fair_output_weight,
            # (what its slots serve a second: the scale of the tags against arrival times)
            tokens_per_s=max(occ.slots, 1) * cfg.costs.decode_tokens_s * max(cfg.fair_output_weight, 1e-9),
        )
        if cfg.fair_tenants and pol.classes
        else None
    )
    expiry = Expiry(
        [c.timeout_s for c in cfg.classes.classes],
        pol.timeouts,
        shedding=cfg.max_queued_total is not None,  # shedding looks at it only then
    )
    lanes = Lanes(
        k,
        tables.levels,
        tables.single,
        list(tables.ceilings) if tables.ceilings is not None else None,
        # GPU placement, and workers of several models, estimate waits by the queue of a model
        lane_counts=planner is not None or len({w.models for w in workers}) > 1,
        expiry=expiry,
        admission=admission,
    )
    promises = Promises(k)
    reqs: dict[str, Request] = {}
    inheritance = Inheritance(reqs, lanes, occ, promises, tables.victims)
    live_requests = Live(reqs, admission, inheritance)
    loads = ModelLoads(planner, occ, lanes, counters) if planner is not None else None
    estimator = Estimator(
        tables,
        cfg.drain_cap_s,
        cfg.mlfq_slice_s,
        lanes,
        occ,
        measures,
        placement.down,
        planner,
        isolation,
    )
    refusals = Refusals(
        tables, cfg.classes, placement, admission, lanes, expiry, live_requests, estimator, counters
    )
    selector = Selector(tables, lanes, occ.running, promises)
    preemptor = Preemptor(tables, cfg, reqs, lanes, occ, promises, selector, measures, counters, planner)
    slices = TimeSlices(cfg.mlfq_slice_s, lanes, occ, preemptor)  # (empty but under mlfq)
    # (slots kept a moment for the class that freed them: slot placements only)
    holds = Holds(tables.rights_of, cfg.hold_s if planner is None else 0.0)
    # (urgent work stops batch work where its prompt is cached: placement by prefix over
    # several workers, under a policy that preempts at once)
    affinity = (
        AffinityStops(placement, preemptor, promises, tables.victims)
        if isinstance(placement, SlotPlacement)
        and placement.index is not None
        and len(states) > 1
        and isolation is None
        and tables.preempting
        and tables.preemption is not PreemptionMode.DRAIN
        else None
    )
    preemptor.stops = affinity
    preemptor.guard = guard
    dispatcher = Dispatcher(
        tables,
        lanes,
        occ,
        promises,
        selector,
        fair,
        measures.calibration,
        counters,
        slices,
        loads,
        holds,
        isolation,
        affinity,
        guard,
    )
    return Parts(
        tables=tables,
        occupancy=occ,
        lanes=lanes,
        promises=promises,
        measures=measures,
        counters=counters,
        admission=admission,
        expiry=expiry,
        reqs=reqs,
        live_requests=live_requests,
        inheritance=inheritance,
        fair=fair,
        isolation=isolation,
        guard=guard,
        loads=loads,
        estimator=estimator,
        refusals=refusals,
        preemptor=preemptor,
        slices=slices,
        holds=holds,
        dispatcher=dispatcher,
    )
