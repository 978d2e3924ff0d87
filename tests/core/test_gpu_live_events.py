"""What a live fleet tells the core beyond ``loaded``: a replica gone without an eviction
(its launch failed, its engine died) and the load time an engine really took."""

from __future__ import annotations

import pytest

from laneway.core import ConfigError, Dispatch, LanewayError, Scheduler
from laneway.core.decisions import Evict, Load
from laneway.core.inventory import Inventory, ModelSpec

from .gpu_helpers import gpu, gpu_sched, greq, inventory, model


def _loads(out: list[object]) -> list[Load]:
    return [d for d in out if type(d) is Load]


def test_a_replica_that_is_gone_frees_its_gpus_and_a_later_request_loads_it_again() -> None:
    inv = inventory([gpu("g0", 24)], [model("m", 20, load_s=10.0), model("n", 20, load_s=10.0)])
    sched = gpu_sched(inv)
    sched.submit(greq("r0", 2, 0.0, "m"), 0.0)
    (load,) = _loads(sched.schedule(0.0))
    planner = sched.planner
    assert planner is not None and planner.vram.used["g0"] == 20
    # its launch fails: the VRAM is free again, nothing is loading, the books hold
    sched.unloaded(load.replica_id, 1.0)
    assert planner.vram.used["g0"] == 0 and load.replica_id not in planner.replicas
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


def _evicts(out: list[object]) -> list[Evict]:
    return [d for d in out if type(d) is Evict]


def _serve(sched: Scheduler, rid: str, model_name: str, now: float) -> list[object]:
    """Submit one request for ``model_name``; schedule; load what is asked; run it to its end."""
    sched.submit(greq(rid, 2, now, model_name), now)
    out: list[object] = list(sched.schedule(now))
    for ld in _loads(out):
        sched.loaded(ld.replica_id, now + ld.load_s)
    more = sched.schedule(now + 100)
    assert [x for x in [*out, *more] if type(x) is Dispatch and x.request_id == rid]
    sched.finished(rid, now + 101)
    return [*out, *more]


def test_a_model_with_a_sleep_mode_sleeps_when_evicted_and_wakes_where_it_was() -> None:
    a = ModelSpec("a", 20, load_s=40.0, wake_s=2.0)
    inv = inventory([gpu("g0", 24)], [a, model("b", 20, load_s=10.0)])
    sched = gpu_sched(inv)
    planner = sched.planner
    assert planner is not None
    (load_a,) = _loads(_serve(sched, "r0", "a", 0.0))
    assert load_a.load_s == 40.0 and not load_a.wake
    # b needs the GPU: a is put to sleep (its VRAM free), b loaded cold
    out = _serve(sched, "r1", "b", 200.0)
    assert [(e.replica_id, e.sleep) for e in _evicts(out)] == [(load_a.replica_id, True)]
    (load_b,) = _loads(out)
    assert planner.vram.used["g0"] == 20 and load_a.replica_id in planner.asleep
    # a again: b (no sleep mode) is stopped, a woken on its GPU in its wake time, as itself
    est = sched.estimate_wait(2, "a", 400.0)
    out = _serve(sched, "r2", "a", 400.0)
    assert [(e.replica_id, e.sleep) for e in _evicts(out)] == [(load_b.replica_id, False)]
    (wake,) = _loads(out)
    assert (wake.replica_id, wake.wake, wake.load_s, wake.gpu_ids) == (load_a.replica_id, True, 2.0, ("g0",))
    assert est < 10.0  # (the estimate counts the 2 s wake, not a 40 s cold start)
    assert sched.snapshot().model_loads == 2  # (a wake is no load)
    assert planner.wakes == 1 and not planner.asleep
    sched.check_invariants()
    planner.check()


def test_past_max_asleep_the_oldest_asleep_replica_is_stopped() -> None:
    specs = [ModelSpec(n, 20, load_s=30.0, wake_s=1.0) for n in ("a", "b", "c")]
    inv = Inventory((gpu("g0", 24),), {m.name: m for m in specs}, (), max_asleep=1)
    sched = gpu_sched(inv)
    planner = sched.planner
    assert planner is not None
    (la,) = _loads(_serve(sched, "r0", "a", 0.0))
    (lb,) = _loads(_serve(sched, "r1", "b", 200.0))  # a sleeps
    out = _serve(sched, "r2", "c", 400.0)  # b sleeps; a, the oldest asleep, is stopped
    assert [(e.replica_id, e.sleep) for e in _evicts(out)] == [(lb.replica_id, True), (la.replica_id, False)]
    assert list(planner.asleep) == [lb.replica_id]
    # a's engine is gone: a is loaded cold (c sleeps, b is stopped: the oldest asleep); c wakes
    out = _serve(sched, "r3", "a", 600.0)
    (cold,) = _loads(out)
    assert not cold.wake and cold.replica_id != la.replica_id and cold.load_s == 30.0
    assert [e.sleep for e in _evicts(out)] == [True, False] and _evicts(out)[1].replica_id == lb.replica_id
    (woken,) = _loads(_serve(sched, "r4", "c", 800.0))
    assert woken.wake and woken.model == "c"
    # an engine that dies asleep is forgotten
    sched.unloaded(next(iter(planner.asleep)), 900.0)
    assert not planner.asleep
    with pytest.raises(ConfigError, match="max_asleep"):
        Inventory((gpu("g0", 24),), {}, (), max_asleep=-1)
    with pytest.raises(ConfigError, match="wake_s"):
        ModelSpec("x", 1, wake_s=-1.0)


def test_a_preloaded_model_that_lost_its_replica_is_loaded_again_into_free_vram() -> None:
    inv = inventory([gpu("g0", 24), gpu("g1", 24)], [model("p", 20), model("q", 40, gpus=2)], ("p",))
    sched = gpu_sched(inv)
    planner = sched.planner
    assert planner is not None
    (rid,) = planner.replicas
    assert sched.reload("p", 1.0) == []  # (it has its replica)
    sched.unloaded(rid, 1.0)  # its engine died
    (again,) = sched.reload("p", 2.0)
    assert type(again) is Load and again.model == "p" and not again.wake
    assert sched.reload("p", 3.0) == []  # (one is loading)
    sched.loaded(again.replica_id, 4.0)
    # no room without evicting: nothing (the next request for it loads it the usual way)
    sched.unloaded(again.replica_id, 5.0)
    sched.submit(greq("r0", 2, 5.0, "q"), 5.0)
    loads = _loads(sched.schedule(5.0))
    assert [(ld.model, ld.gpu_ids) for ld in loads] == [("q", ("g0", "g1"))]  # q takes both GPUs
    assert sched.reload("p", 6.0) == []
    assert sched.snapshot().model_loads == 2  # (p again, then q; the preload was none)


# -- a cluster's leader: engines placed by a leader before it, nodes nobody starts engines on --
def test_an_engine_placed_before_is_adopted_where_it_runs_and_takes_work_at_once() -> None:
    inv = inventory([gpu("a0", 24, "a"), gpu("b0", 24, "b")], [model("m", 20), model("n", 20)])
    sched = gpu_sched(inv)
    sched.adopt_replica("n#7@b0", "n", ("b0",), 0.0)
    planner = sched.planner
    assert planner is not None and planner.vram.used == {"a0": 0.0, "b0": 20.0}
    sched.submit(greq("r0", 2, 0.0, "n"), 0.0)
    out = sched.schedule(0.0)
    assert [(d.request_id, d.worker_id) for d in out if type(d) is Dispatch] == [("r0", "n#7@b0")]
    # the ids it makes from now on are new ones
    sched.submit(greq("r1", 2, 0.0, "m"), 0.0)
    (load,) = _loads(sched.schedule(0.0))
    assert load.replica_id == "m#8@a0"
    sched.check_invariants()
    planner.check()
    # what cannot be: an unknown model, GPUs taken, a replica known already
    for rid, m, gpus, why in [
        ("x#1@a0", "x", ("a0",), "no model 'x'"),
        ("n#9@a0", "n", ("a0",), "no room for 'n' left on a0"),
        ("n#7@b0", "n", ("b0",), "placed already"),
        ("n#9@z0", "n", ("z0",), "cannot hold 'n'"),
    ]:
        with pytest.raises(ConfigError, match=why):
            sched.adopt_replica(rid, m, gpus, 1.0)
    planner.check()


def test_nothing_is_loaded_on_an_offline_node_until_it_is_back() -> None:
    inv = inventory([gpu("a0", 24, "a"), gpu("b0", 80, "b")], [model("m", 20)])
    sched = gpu_sched(inv)
    sched.set_offline({"a"})
    sched.submit(greq("r0", 2, 0.0, "m"), 0.0)
    (load,) = _loads(sched.schedule(0.0))
    assert load.gpu_ids == ("b0",)  # (a0 fits best, but its node is offline)
    sched.set_offline({"a", "b"})
    sched.submit(greq("r1", 2, 0.0, "m"), 0.0)
    sched.submit(greq("r2", 2, 0.0, "m"), 0.0)
    sched.submit(greq("r3", 2, 0.0, "m"), 0.0)
    sched.submit(greq("r4", 2, 0.0, "m"), 0.0)
    assert _loads(sched.schedule(1.0)) == []  # (more demand than one replica: still nowhere to load)
    sched.set_offline(set())
    (again,) = _loads(sched.schedule(2.0))
    assert again.gpu_ids == ("a0",)
