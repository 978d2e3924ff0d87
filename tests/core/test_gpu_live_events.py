"""What a live fleet tells the core beyond ``loaded``: a replica gone without an eviction
(its launch failed, its engine died) and the load time an engine really took."""

from __future__ import annotations

import pytest

from laneway.core import Dispatch, LanewayError
from laneway.core.decisions import Load

from .gpu_helpers import gpu, gpu_sched, greq, inventory, model


def _loads(out: list[object]) -> list[Load]:
    return [d for d in out if type(d) is Load]


def test_a_replica_that_is_gone_frees_its_gpus_and_a_later_request_loads_it_again() -> None:
    inv = inventory([gpu("g0", 24)], [model("m", 20, load_s=10.0), model("n", 20, load_s=10.0)])
    sched = gpu_sched(inv)
    sched.submit(greq("r0", 2, 0.0, "m"), 0.0)
    (load,) = _loads(sched.schedule(0.0))
    planner = sched.planner
    assert planner is not None and planner.used["g0"] == 20
    # its launch fails: the VRAM is free again, nothing is loading, the books hold
    sched.unloaded(load.replica_id, 1.0)
    assert planner.used["g0"] == 0 and load.replica_id not in planner.replicas
    sched.check_invariants()
    planner.check()
    # the queued request asks for a load again; another model fits in the freed VRAM too
    (again,) = _loads(sched.schedule(2.0))
    assert again.model == "m" and again.replica_id != load.replica_id
    sched.loaded(again.replica_id, 5.0)
    out = sched.schedule(5.0)
    assert [(d.request_id, d.worker_id) for d in out if type(d) is Dispatch] == [("r0", again.replica_id)]
    # a replica that runs a request cannot be dropped (its requests are ended or moved first)
    with pytest.raises(LanewayError, match="still runs 1"):
        sched.unloaded(again.replica_id, 6.0)
    with pytest.raises(LanewayError, match="unknown replica"):
        sched.unloaded("nope", 6.0)


def test_a_measured_load_time_replaces_the_configured_one() -> None:
    inv = inventory([gpu("g0", 24), gpu("g1", 24)], [model("m", 20, load_s=30.0)])
    sched = gpu_sched(inv)
    sched.submit(greq("r0", 2, 0.0, "m"), 0.0)
    (first,) = _loads(sched.schedule(0.0))
    assert first.load_s == 30.0
    sched.load_took("m", 4.5)
    sched.loaded(first.replica_id, 4.5)
    planner = sched.planner
    assert planner is not None
    assert planner.replicas[first.replica_id].model.load_s == 4.5  # (the replicas hold the new spec)
    assert planner.inv.models["m"].load_s == 4.5
    for i in (1, 2, 3, 4, 5):  # more than one replica's slots: a second replica
        sched.submit(greq(f"r{i}", 2, 5.0, "m"), 5.0)
    (second,) = _loads(sched.schedule(5.0))
    assert second.load_s == 4.5 and second.gpu_ids == ("g1",)
    sched.check_invariants()
