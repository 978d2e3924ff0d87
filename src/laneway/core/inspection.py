"""Looking inside the scheduler: gauges for metrics, and its invariants, checked.

Each owner checks its own books (:meth:`Occupancy.check`, :meth:`Promises.check`,
:meth:`GpuPlacement.check`); :func:`check_invariants` checks that they agree with each
other and with the requests' states.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from laneway.core.placement import SlotPlacement
from laneway.core.request import State
from laneway.core.stats import Snapshot

if TYPE_CHECKING:
    from laneway.core.scheduler import Scheduler

_RUNNING = State.RUNNING
_PREEMPTED = State.PREEMPTED
_QUEUED = State.QUEUED


def snapshot(s: Scheduler) -> Snapshot:
    names = s.tables.names
    c = s.counters
    occ = s.occupancy
    planner = s.loads.planner if s.loads is not None else None
    return Snapshot(
        queue_depth={n: s.lanes.class_count[i] for i, n in enumerate(names)},
        running={n: len(occ.running[i]) for i, n in enumerate(names)},
        slots_total=occ.slots,
        slots_free=occ.free,
        submitted=s.live_requests.seq,
        dispatched=c.dispatched,
        drains=c.drains,
        completed=dict(zip(names, s.measures.service.n, strict=True)),
        preemptions=dict(zip(names, c.preemptions, strict=True)),
        rejections=dict(c.rejections),
        model_loads=c.model_loads,
        prefix_hits=_prefix_hits(occ.placement),
        **(planner.gauges() if planner is not None else {}),
    )


def _prefix_hits(placement: object) -> dict[str, float]:
    index = placement.index if isinstance(placement, SlotPlacement) else None
    if index is None:
        return {}
    return {w: index.matched_blocks.get(w, 0) / n for w, n in index.sent_blocks.items() if n}


def check_invariants(s: Scheduler) -> None:
    """Raise ``AssertionError`` if the internal state is inconsistent."""
    occ = s.occupancy
    if s.loads is not None:
        planner = s.loads.planner
        planner.check()
        ready = {rid for rid, r in planner.replicas.items() if r.ready}
        assert ready == set(occ.workers), "ready replicas and workers differ"
    on_workers = occ.check()
    for w in occ.workers.values():
        for rid, r in w.running.items():
            assert r.state in (_RUNNING, _PREEMPTED), f"{rid} on a worker while {r.state}"
    k = s.tables.k
    queued = [0] * k
    reqs = s.live_requests.reqs
    for rid, r in reqs.items():
        assert r.state in (_QUEUED, _RUNNING, _PREEMPTED), f"{rid} live while {r.state}"
        if r.state is _QUEUED:
            queued[r.cls] += 1
            assert rid not in on_workers, f"{rid} both queued and running"
        else:
            assert on_workers.get(rid) == r.worker, f"{rid} not on its worker"
            assert rid in occ.running[r.cls]
    assert queued == s.lanes.class_count, (queued, s.lanes.class_count)
    s.promises.check(reqs.values())
    s.holds.check()
