"""GPU-aware placement through the scheduler: resident replicas first, loads
best-fit without evictions, multi-GPU models on one node, LRU eviction of idle
replicas, class-reserved GPUs, same-model grouping with bounded switches,
preemption on the replicas of the model, and the naive baseline."""

from __future__ import annotations

import math

from laneway.core import Dispatch, Preempt
from laneway.core.decisions import Evict, Load

from .gpu_helpers import GpuDriver, gpu, gpu_sched, greq, inventory, model

INF = math.inf


def loads_of(d: GpuDriver) -> list[tuple[str, tuple[str, ...]]]:
    return [(ld.model, ld.gpu_ids) for _, ld in d.loads]


def evicted(d: GpuDriver) -> list[str]:
    return [ev.model for _, ev in d.evictions]


# -- resident replicas first --------------------------------------------------------
def test_a_resident_replica_with_a_free_slot_takes_the_request_without_a_load() -> None:
    inv = inventory([gpu("g0", 24), gpu("g1", 80)], [model("m", 14, slots=2)], ("m",))
    d = GpuDriver(gpu_sched(inv))
    (rep,) = d.ready
    for i in range(2):
        d.submit(greq(f"r{i}", 2, 0.0, "m"))
    out = d.step()
    assert [(x.request_id, x.worker_id) for x in out if type(x) is Dispatch] == [("r0", rep), ("r1", rep)]
    assert d.loads == []
    # its slots are full: a third request loads a second replica
    d.submit(greq("r2", 2, 0.0, "m"))
    d.step()
    assert loads_of(d) == [("m", ("g1",))]


def test_the_least_loaded_resident_replica_is_chosen() -> None:
    inv = inventory([gpu("g0", 24), gpu("g1", 24)], [model("m", 14, slots=4)], ("m", "m"))
    d = GpuDriver(gpu_sched(inv))
    for i in range(4):
        d.submit(greq(f"r{i}", 2, 0.0, "m"))
        d.step()
    per_replica: dict[str, int] = {}
    for rid in d.running.values():
        per_replica[rid] = per_replica.get(rid, 0) + 1
    assert sorted(per_replica.values()) == [2, 2]
    assert d.loads == []


# -- loads: only after ``loaded`` does the request start -----------------------------------
def test_a_load_is_emitted_with_the_models_load_s_and_the_request_waits_for_loaded() -> None:
    inv = inventory([gpu("g0", 24)], [model("m", 14, load_s=25.0)])
    d = GpuDriver(gpu_sched(inv), auto_load=False)
    d.submit(greq("r", 0, 0.0, "m", timeout_s=INF))
    out = d.step()
    (ld,) = [x for x in out if type(x) is Load]
    assert (ld.model, ld.gpu_ids, ld.load_s) == ("m", ("g0",), 25.0)
    assert not [x for x in out if type(x) is Dispatch]
    d.advance(100.0)  # nobody answered ``loaded``: nothing starts
    assert d.started("r") is None and len(d.loads) == 1
    assert d.sched.estimate_wait(0, "m", d.now) >= 0.0
    assert d.sched.estimate_wait(2, None, d.now) == INF  # no ready replica: no slot at all
    out = d.load_done(ld.replica_id)
    assert [(x.request_id, x.worker_id) for x in out if type(x) is Dispatch] == [("r", ld.replica_id)]


def test_with_the_runtime_answering_on_time_the_request_starts_load_s_later() -> None:
    inv = inventory([gpu("g0", 24)], [model("m", 14, load_s=25.0)])
    d = GpuDriver(gpu_sched(inv))
    d.submit(greq("r", 2, 0.0, "m"))
    d.step()
    d.advance(24.0)
    assert d.started("r") is None
    d.advance(10.0)
    assert d.started("r") == 25.0
    # the estimate for a model being loaded counts the rest of the load
    d2 = GpuDriver(gpu_sched(inv))
    d2.submit(greq("r", 2, 0.0, "m"))
    d2.step()
    assert d2.sched.estimate_wait(2, "m", 5.0) >= 20.0 - 1e-9


def test_a_model_being_loaded_is_not_loaded_twice_for_the_same_demand() -> None:
    inv = inventory([gpu("g0", 80), gpu("g1", 80), gpu("g2", 80)], [model("m", 14, slots=4, load_s=30)])
    d = GpuDriver(gpu_sched(inv))
    for i in range(3):
        d.submit(greq(f"r{i}", 2, float(i), "m"))
        d.advance(1.0)
    assert len(d.loads) == 1  # one replica's 4 slots serve the 3 queued
    for i in range(3, 5):
        d.submit(greq(f"r{i}", 2, d.now, "m"))
    d.advance(1.0)
    assert len(d.loads) == 2  # 5 queued > 4 slots loading: one more replica
    d.advance(5.0)
    assert len(d.loads) == 2
    d.advance(40.0)
    assert all(d.started(f"r{i}") is not None for i in range(5))
    assert len(d.loads) == 2


# -- best fit ----------------------------------------------------------------------------
def test_best_fit_a_14gb_model_goes_to_the_24gb_gpu_not_the_80gb_one() -> None:
    inv = inventory([gpu("big", 80), gpu("small", 24)], [model("m", 14)])
    d = GpuDriver(gpu_sched(inv))
    d.submit(greq("r", 2, 0.0, "m"))
    d.step()
    assert loads_of(d) == [("m", ("small",))]


def test_best_fit_is_the_smallest_leftover_after_the_kv_reserve() -> None:
    # usable: g80 72, g48 44, g24 12 (too small for 14 once its KV reserve is held), g32 30
    inv = inventory(
        [gpu("g80", 80, kv=8), gpu("g48", 48, kv=4), gpu("g24", 24, kv=12), gpu("g32", 32, kv=2)],
        [model("m14", 14), model("m30", 30), model("m40", 40)],
    )
    d = GpuDriver(gpu_sched(inv))
    for i, m in enumerate(["m14", "m30", "m40"]):
        d.submit(greq(f"r{i}", 2, 0.0, m))
        d.step()
    # m14: g32 (16 left) over g48 (30) and g80 (58); m30: g48 (14 left; g32 has 16 free);
    # m40: g80, the only one left with room
    assert loads_of(d) == [("m14", ("g32",)), ("m30", ("g48",)), ("m40", ("g80",))]


def test_preloaded_models_are_placed_best_fit_too() -> None:
    inv = inventory([gpu("big", 80, kv=8), gpu("small", 24, kv=2.4)], [model("chat", 14)], ("chat",))
    d = GpuDriver(gpu_sched(inv))
    assert list(d.replica_gpus.values()) == [("small",)]
    assert d.placement.loads == 0 and d.sched.counters.model_loads == 0


def test_a_load_that_evicts_nothing_is_preferred_to_a_tighter_fit_after_an_eviction() -> None:
    inv = inventory(
        [gpu("small", 24), gpu("big", 80)],
        [model("old", 20, load_s=1.0), model("new", 14, load_s=1.0)],
        ("old",),
    )
    d = GpuDriver(gpu_sched(inv))
    assert list(d.replica_gpus.values()) == [("small",)]
    d.advance(100.0)  # "old" idle for long and unwanted: evictable
    d.submit(greq("r", 2, d.now, "new"))
    d.step()
    assert loads_of(d) == [("new", ("big",))]
    assert d.evictions == []


# -- multi-GPU models: GPUs of one node ---------------------------------------------------------
def test_a_multi_gpu_model_gets_gpus_of_one_node_only() -> None:
    # node a: a0 80 + a1 40; node b: b0 80 + b1 40; "x" (70 GB) on a0 and b0, busy
    inv = inventory(
        [gpu("a0", 80, "a"), gpu("a1", 40, "a"), gpu("b0", 80, "b"), gpu("b1", 40, "b")],
        [model("x", 70, slots=1, load_s=5.0), model("tp", 80, gpus=2, load_s=5.0)],
        ("x", "x"),
    )
    d = GpuDriver(gpu_sched(inv))
    assert sorted(d.replica_gpus.values()) == [("a0",), ("b0",)]
    d.submit(greq("x-a", 2, 0.0, "x"))
    d.submit(greq("x-b", 2, 0.0, "x"))
    d.step()
    d.submit(greq("tp", 2, 0.0, "tp"))
    d.advance(20.0)  # a1 and b1 are free (40 each): 2 GPUs, but of two nodes
    assert d.loads == [] and d.started("tp") is None
    d.finish("x-a" if d.gpus_of("x-a") == ("a0",) else "x-b")  # a0's replica goes idle
    d.step()
    assert evicted(d) == ["x"]
    ((name, gpus),) = loads_of(d)
    assert name == "tp" and sorted(gpus) == ["a0", "a1"]
    d.advance(5.0)
    assert sorted(d.gpus_of("tp")) == ["a0", "a1"]


def test_multi_gpu_model_prefers_the_node_where_it_fits_best() -> None:
    inv = inventory(
        [gpu("a0", 80, "a"), gpu("a1", 80, "a"), gpu("b0", 40, "b"), gpu("b1", 40, "b"), gpu("b2", 40, "b")],
        [model("tp", 70, gpus=2)],
    )
    d = GpuDriver(gpu_sched(inv))
    d.submit(greq("r", 2, 0.0, "tp"))
    d.step()
    (ld,) = [x for _, x in d.loads]
    assert ld.gpu_ids in {("b0", "b1"), ("b0", "b2"), ("b1", "b2")}  # 35 each: 5 GB left, not 45


# -- eviction: idle replicas, least recently used first ----------------------------------------
def lru_fleet(extra: float = 24.0) -> GpuDriver:
    """One 80 GB GPU holding a, b, c (24 GB each, 8 GB free); used b at 1, a at 3, c at 5."""
    inv = inventory(
        [gpu("g", 80)],
        [
            model("a", 24, load_s=1.0, slots=1),
            model("b", 24, load_s=1.0, slots=1),
            model("c", 24, load_s=1.0, slots=1),
            model("new", extra, load_s=1.0, slots=1),
        ],
        ("a", "b", "c"),
    )
    d = GpuDriver(gpu_sched(inv))
    for t, m in [(1.0, "b"), (3.0, "a"), (5.0, "c")]:
        d.advance(t - d.now)
        d.submit(greq(f"use-{m}", 2, d.now, m))
        d.step()
        assert d.started(f"use-{m}") == t
        d.advance(0.5)
        d.finish(f"use-{m}")
    return d


def test_the_least_recently_used_idle_replica_is_evicted_for_a_load() -> None:
    d = lru_fleet()
    d.advance(10.0)
    d.submit(greq("r", 2, d.now, "new"))
    d.step()
    assert evicted(d) == ["b"]
    assert loads_of(d) == [("new", ("g",))]
    # evictions come before the load in the decision order
    kinds = [type(x).__name__ for _, x in d.log if type(x) in (Evict, Load)]
    assert kinds == ["Evict", "Load"]


def test_evictions_free_just_enough_in_lru_order() -> None:
    d = lru_fleet(extra=50.0)  # 8 free: two 24 GB replicas must go
    d.advance(10.0)
    d.submit(greq("r", 2, d.now, "new"))
    d.step()
    assert evicted(d) == ["b", "a"]
    assert sorted(m for m in d.replica_model.values()) == ["c", "new"]


def test_a_replica_with_running_work_is_never_evicted() -> None:
    d = lru_fleet()
    d.submit(greq("busy-b", 2, d.now, "b"))  # b, the LRU, runs again
    d.step()
    d.advance(10.0)
    d.submit(greq("r", 2, d.now, "new"))
    d.step()
    assert evicted(d) == ["a"]  # the next least recently used
    d.advance(600.0)  # nothing else is ever evicted: nobody needs the room
    assert evicted(d) == ["a"]
    assert "busy-b" in d.running


def test_nothing_is_evicted_while_every_replica_is_busy() -> None:
    d = lru_fleet()
    for m in "abc":
        d.submit(greq(f"hold-{m}", 2, d.now, m))
    d.step()
    d.submit(greq("r", 2, d.now, "new", timeout_s=INF))
    d.advance(30.0)
    assert d.evictions == [] and d.loads == []
    d.finish("hold-c")
    d.advance(5.0)
    assert evicted(d) == ["c"]
    d.advance(5.0)
    assert d.started("r") is not None


# -- class-reserved GPUs ---------------------------------------------------------------------
def test_a_gpu_reserved_for_p0_p1_gets_no_p2_work() -> None:
    inv = inventory([gpu("online", 24, reserved={0, 1}), gpu("any", 80)], [model("m", 14, slots=4)])
    d = GpuDriver(gpu_sched(inv))
    d.submit(greq("batch", 2, 0.0, "m"))
    d.step()
    assert loads_of(d) == [("m", ("any",))]  # though "online" fits best


def test_p2_work_is_not_placed_on_a_reserved_replica_with_free_slots() -> None:
    inv = inventory([gpu("online", 24, reserved={0, 1}), gpu("any", 80)], [model("m", 14, slots=4)])
    d = GpuDriver(gpu_sched(inv))
    d.submit(greq("chat", 0, 0.0, "m"))
    d.advance(0.0)
    assert loads_of(d) == [("m", ("online",))]
    d.advance(10.0)
    assert d.gpus_of("chat") == ("online",)
    d.submit(greq("batch", 2, d.now, "m"))
    d.step()
    assert d.started("batch") is None  # 3 free slots on "online", but not for P2
    assert loads_of(d)[-1] == ("m", ("any",))
    d.advance(10.0)
    assert d.gpus_of("batch") == ("any",)
    d.submit(greq("chat2", 1, d.now, "m"))  # P1 may use either
    d.step()
    assert d.started("chat2") is not None


# -- same-model grouping and bounded switches --------------------------------------------------
def one_gpu_two_models(**kw: float) -> GpuDriver:
    """One 24 GB GPU; "a" (20 GB, 1 slot) resident, "b" (20 GB) not: they cannot share it."""
    inv = inventory(
        [gpu("g", 24)],
        [model("a", 20, load_s=5.0, slots=1), model("b", 20, load_s=5.0, slots=1)],
        ("a",),
    )
    return GpuDriver(gpu_sched(inv, **kw))


def test_a_request_for_the_resident_model_overtakes_one_needing_a_busy_replica_evicted() -> None:
    d = one_gpu_two_models()
    d.submit(greq("a1", 2, 0.0, "a", timeout_s=INF))
    d.step()
    d.advance(1.0)
    d.submit(greq("b1", 2, d.now, "b", timeout_s=INF))  # needs "a" gone, but "a" is busy
    d.advance(1.0)
    d.submit(greq("a2", 2, d.now, "a", timeout_s=INF))  # same class, later
    d.advance(8.0)
    assert d.loads == [] and d.evictions == []
    d.finish("a1")
    d.step()
    assert d.started("a2") == 10.0  # grouped onto the resident model: no switch
    assert d.started("b1") is None and d.loads == [] and d.evictions == []
    d.advance(10.0)
    d.finish("a2")  # nobody wants "a" any more; idle past its load time, it goes
    d.step()
    assert evicted(d) == ["a"] and loads_of(d) == [("b", ("g",))]
    d.advance(5.0)
    assert d.started("b1") == 25.0


def test_after_switch_wait_the_waiting_request_gets_its_switch() -> None:
    d = one_gpu_two_models()
    d.submit(greq("a0", 2, 0.0, "a", timeout_s=INF))
    d.step()
    d.advance(1.0)
    d.submit(greq("b1", 2, d.now, "b", timeout_s=INF))
    # "a" stays busy: each a-request runs 20 s and the next one is queued before it ends
    t = d.now
    n = 0
    running = "a0"
    while d.started("b1") is None and d.now < 600.0:
        n += 1
        d.submit(greq(f"a{n}", 2, d.now, "a", timeout_s=INF))
        d.advance(20.0 - (d.now - t))
        t = d.now
        if running in d.running:
            d.finish(running)
        d.step()
        nxt = [r for r in d.running if r.startswith("a")]
        running = nxt[0] if nxt else running
    start = d.started("b1")
    # it waited switch_wait_s (60 s), then "a" was drained, evicted and "b" loaded
    assert start is not None, "b1 starved: the resident model's demand never let it switch"
    assert start <= 1.0 + 60.0 + 20.0 + 5.0 + 20.0, start
    assert "a" in evicted(d) and ("b", ("g",)) in loads_of(d)


def test_a_switch_is_not_starved_by_an_overloaded_resident_model() -> None:
    """The replica in the way has 2 slots and always work running and queued (a
    20 s job arrives every 5 s): it never goes idle by itself. After
    ``switch_wait_s`` it must be drained (no new work), then evicted for b1."""
    inv = inventory(
        [gpu("g", 24)],
        [model("a", 20, load_s=5.0, slots=2), model("b", 20, load_s=5.0, slots=1)],
        ("a",),
    )
    d = GpuDriver(gpu_sched(inv))
    n = 0
    while d.now < 400.0 and d.started("b1") is None:
        d.submit(greq(f"a{n}", 2, d.now, "a", timeout_s=INF))
        if n == 1:
            d.submit(greq("b1", 2, d.now, "b", timeout_s=INF))
        n += 1
        d.step()
        for rid in sorted(d.running):
            started = d.started(rid)
            if rid.startswith("a") and started is not None and d.now - started >= 20.0 - 1e-9:
                d.finish(rid)
        d.step()
        d.advance(5.0)
    start = d.started("b1")
    # b1 arrived at 5: 60 s of polite waiting, <= 20 s for "a"'s running work, a 5 s load
    assert start is not None, f"b1 starved behind {d.sched.queued} queued a-requests"
    assert start <= 5.0 + 60.0 + 20.0 + 5.0 + 5.0, start


def test_switch_wait_is_configurable() -> None:
    d = one_gpu_two_models(switch_wait_s=5.0)
    d.submit(greq("a1", 2, 0.0, "a", timeout_s=INF))
    d.step()
    d.submit(greq("b1", 2, 0.0, "b", timeout_s=INF))
    d.submit(greq("a2", 2, 0.0, "a", timeout_s=INF))
    d.advance(10.0)
    d.finish("a1")
    d.step()  # b1 has waited 10 s > 5 s: it gets the switch before a2 gets "a" again
    assert d.started("a2") is None
    assert evicted(d) == ["a"] and loads_of(d) == [("b", ("g",))]
    d.advance(5.0)
    assert d.started("b1") == 15.0


def test_a_waiting_request_is_woken_when_an_idle_replica_may_be_evicted() -> None:
    """Nothing else happens: the scheduler must ask to be called when the idle
    replica in the way passes its break-even (idle for its load time), else the
    request waits until some unrelated event, or its queue timeout."""
    d = one_gpu_two_models()
    d.submit(greq("a1", 2, 0.0, "a"))
    d.step()
    d.advance(1.0)
    d.finish("a1")  # "a" was last used at 0: it may go from t=5 on
    d.step()
    d.submit(greq("b1", 2, d.now, "b"))
    d.step()
    assert d.evictions == []
    assert d.sched.next_wakeup() <= 5.0, "no wakeup for the eviction that would serve b1"


# -- preemption on GPUs -------------------------------------------------------------------------
def test_p0_preempts_the_p2_on_a_replica_of_its_own_model() -> None:
    inv = inventory(
        [gpu("g0", 24), gpu("g1", 24)],
        [model("a", 20, slots=1), model("b", 20, slots=1)],
        ("a", "b"),
    )
    d = GpuDriver(gpu_sched(inv))
    d.submit(greq("pa", 2, 0.0, "a", est_service_s=300.0))
    d.step()
    d.advance(5.0)
    d.submit(greq("pb", 2, d.now, "b", est_service_s=300.0))  # started later: least to lose
    d.step()
    d.advance(5.0)
    d.submit(greq("chat", 0, d.now, "a", est_service_s=2.0))
    out = d.step()
    pre = [x for x in out if type(x) is Preempt]
    claims = {rid for rid in ("pa", "pb") if d.sched.get(rid).claimed_for is not None}
    assert [x.request_id for x in pre] == ["pa"] or (not pre and claims == {"pa"})
    assert "pb" not in d.stopping and d.sched.get("pb").claimed_for is None
    if pre:
        assert pre[0].worker_id == d.worker_of("pa")
        d.ack("pa")
    else:
        d.finish("pa")
    d.step()
    assert d.started("chat") is not None
    assert d.replica_model[d.worker_of("chat")] == "a"
    assert "pb" in d.running and d.evictions == [] and d.loads == []


def test_p0_does_not_preempt_work_of_another_model_when_its_own_replica_has_room_soon() -> None:
    inv = inventory(
        [gpu("g0", 24), gpu("g1", 24)],
        [model("a", 20, slots=2), model("b", 20, slots=1)],
        ("a", "b"),
    )
    d = GpuDriver(gpu_sched(inv))
    d.submit(greq("pb", 2, 0.0, "b", est_service_s=300.0))
    d.submit(greq("pa", 2, 0.0, "a", est_service_s=300.0))
    d.step()
    d.submit(greq("chat", 0, 1.0, "a"))
    d.advance(1.0)
    assert d.worker_of("chat") == d.worker_of("pa")  # a's second slot
    assert not d.stopping


# -- naive placement -----------------------------------------------------------------------------
def naive_fleet(policy: str) -> GpuDriver:
    inv = inventory([gpu("g80", 80), gpu("g24a", 24), gpu("g24b", 24)], [model("m", 14, slots=4, load_s=10)])
    return GpuDriver(gpu_sched(inv, policy))


def test_naive_loads_on_the_first_idle_gpu_that_fits_not_the_best_fit() -> None:
    d = naive_fleet("naive")
    d.submit(greq("r0", 2, 0.0, "m"))
    d.step()
    assert loads_of(d) == [("m", ("g80",))]
    lw = naive_fleet("laneway")
    lw.submit(greq("r0", 2, 0.0, "m"))
    lw.step()
    assert loads_of(lw) == [("m", ("g24a",))]


def test_naive_runs_one_request_per_gpu_and_loads_though_the_model_is_resident_elsewhere() -> None:
    d = naive_fleet("naive")
    d.submit(greq("r0", 2, 0.0, "m"))
    d.step()
    d.advance(10.0)
    assert d.gpus_of("r0") == ("g80",)
    d.submit(greq("r1", 2, d.now, "m"))  # g80's replica has 3 free slots
    d.step()
    assert d.started("r1") is None
    assert loads_of(d) == [("m", ("g80",)), ("m", ("g24a",))]
    d.advance(10.0)
    assert d.gpus_of("r1") == ("g24a",)
    # the laneway placement puts it on the resident replica's free slot at once
    lw = naive_fleet("laneway")
    lw.submit(greq("r0", 2, 0.0, "m"))
    lw.step()
    lw.advance(10.0)
    lw.submit(greq("r1", 2, lw.now, "m"))
    lw.step()
    assert lw.started("r1") == lw.now and lw.worker_of("r1") == lw.worker_of("r0")
    assert len(lw.loads) == 1


def test_naive_uses_a_resident_replica_on_an_idle_gpu_without_a_load() -> None:
    d = naive_fleet("naive")
    d.submit(greq("r0", 2, 0.0, "m"))
    d.step()
    d.advance(10.0)
    d.finish("r0")
    d.submit(greq("r1", 2, d.now, "m"))
    d.step()
    assert d.started("r1") == d.now and d.gpus_of("r1") == ("g80",)
    assert len(d.loads) == 1


def test_naive_evicts_whatever_idle_model_is_on_the_first_idle_gpu() -> None:
    inv = inventory([gpu("g0", 24)], [model("a", 20, load_s=5.0), model("b", 20, load_s=5.0)], ("a",))
    d = GpuDriver(gpu_sched(inv, "naive"))
    d.submit(greq("r", 2, 0.0, "b"))
    d.step()  # no grouping, no break-even: "a" goes at once
    assert evicted(d) == ["a"] and loads_of(d) == [("b", ("g0",))]


def test_naive_preloads_every_model_listed_without_evicting_one_for_another() -> None:
    inv = inventory([gpu("g0", 16), gpu("g1", 16)], [model("m", 6, slots=1)], ("m", "m", "m"))
    for policy in ("laneway", "naive"):
        p = gpu_sched(inv, policy).planner
        assert p is not None
        assert len(p.replicas) == 3 and all(r.ready for r in p.replicas.values()), policy
        assert p.evictions == 0 and p.loads == 0, policy
        assert sorted(r.gpus for r in p.replicas.values()) == [("g0",), ("g0",), ("g1",)], policy


def test_naive_does_not_reuse_a_replica_spanning_a_gpu_reserved_for_other_classes() -> None:
    inv = inventory(
        [gpu("g0", 16), gpu("g1", 16, reserved={0}), gpu("g2", 16)],
        [model("tp", 16, gpus=2, load_s=1.0, slots=1)],
    )
    d = GpuDriver(gpu_sched(inv, "naive"))
    d.submit(greq("chat", 0, 0.0, "tp"))
    d.step()
    assert loads_of(d) == [("tp", ("g0", "g1"))]  # the first idle GPUs that admit P0
    d.advance(1.0)
    d.finish("chat")
    d.submit(greq("api", 1, d.now, "tp"))
    d.step()  # the resident replica spans g1, reserved for P0: not for P1
    assert d.started("api") is None or "g1" not in d.gpus_of("api")
    d.advance(5.0)
    assert d.gpus_of("api") == ("g0", "g2")


def drained_for_b() -> tuple[GpuDriver, list[str]]:
    """Two 16 GB GPUs, each with two "a" replicas (6 GB, 1 slot) busy; "b" (12 GB)
    waits with a P1 request, a P0 a-request waits too. At 5 s "b" reaches the
    switch bound: the "a" replicas on g0 are drained for it (until 10 s)."""
    inv = inventory(
        [gpu("g0", 16), gpu("g1", 16)],
        [model("a", 6, load_s=1.0, slots=1), model("b", 12, load_s=1.0, slots=1)],
        ("a", "a", "a", "a"),
    )
    d = GpuDriver(gpu_sched(inv, switch_wait_s=5.0))
    for i in range(5):
        d.submit(greq(f"a{i}", 0, 0.0, "a", timeout_s=INF))
    d.submit(greq("b", 1, 0.0, "b", timeout_s=INF))
    d.step()
    assert sorted(d.running) == ["a0", "a1", "a2", "a3"]
    d.advance(6.0)
    drained = sorted(r.id for r in d.placement.replicas.values() if r.draining)
    assert [d.replica_gpus[r] for r in drained] == [("g0",), ("g0",)]
    on_g0 = sorted(rid for rid, w in d.running.items() if d.replica_gpus[w] == ("g0",))
    return d, on_g0


def test_a_replica_drained_for_another_model_is_not_evicted_to_reload_its_own_model() -> None:
    """When one drained replica goes idle, the queued a-request must not evict it
    only to load "a" again in its place (that replica would be drained in turn,
    evicted and loaded again: with load_s=0, over and over at one instant)."""
    d, on_g0 = drained_for_b()
    d.cancel(on_g0[0])
    d.step()
    d.advance(1.0)
    assert loads_of(d) == [] and d.evictions == []
    d.finish(on_g0[1])  # both drained replicas idle within the drain window: room for b
    d.step()
    assert evicted(d) == ["a", "a"] and loads_of(d) == [("b", ("g0",))]


def test_a_replica_loaded_for_a_waiting_request_serves_it_before_anyone_evicts_it() -> None:
    """ "b" is loaded at 7 s for the waiting b-request. At 8 s it is ready, and
    the P0 a-request (past the switch bound too, examined first) must not evict
    it before the b-request is dispatched to it; else the two models evict each
    other's fresh replica for ever and neither request runs."""
    d, on_g0 = drained_for_b()
    d.cancel(on_g0[0])
    d.step()
    d.advance(1.0)
    d.finish(on_g0[1])
    d.step()
    d.advance(1.0)
    assert d.started("b") == 8.0, d.log[-4:]
    d.advance(60.0)
    assert len(d.loads) <= 3, f"{len(d.loads)} loads in 60 s: {[m for m, _ in loads_of(d)][:9]}"


def test_a_drain_window_that_lapses_unused_does_not_keep_waking_the_scheduler() -> None:
    """graceful: room for "b" is cleared by letting the "a" request end (a drain
    window); the P0 request for "b" is cancelled meanwhile. When the window
    lapses nothing needs it: the next wakeup moves on instead of staying at
    the lapse time (the driver asserts the clock never spins in place)."""
    inv = inventory([gpu("g0", 24)], [model("a", 14, slots=1), model("b", 14, load_s=5.0)], ("a",))
    d = GpuDriver(gpu_sched(inv, "graceful"))
    d.submit(greq("batch", 2, 0.0, "a", est_service_s=10.0))
    d.step()
    d.submit(greq("p0", 0, 0.0, "b"))
    d.step()
    assert not [x for x in d.log if type(x[1]) is Preempt]  # draining, not preempting
    (until, drained) = d.sched.promises.clearing["b"]
    assert drained and 0.0 < until < 30.0
    d.now = 1.0
    d.cancel("p0")
    d.advance(until + 5.0)  # through the lapse
    assert d.sched.next_wakeup() > d.now
    assert "b" not in d.sched.promises.clearing


def test_a_drain_stays_while_the_model_it_is_for_still_waits() -> None:
    """One 24 GB GPU holds "b" (16 GB); a P1 for "a" (16 GB) waits past the switch bound,
    so "b" is drained (no new work) until its running requests end. The drain must hold
    for as long as "a" waits: it lapsed after one window (at 10.5 s), and a queued b
    request took the slot the first b request freed, so "a" waited for that one too."""
    inv = inventory(
        [gpu("g0", 24)], [model("a", 16, load_s=1.0, slots=2), model("b", 16, load_s=1.0, slots=2)], ("b",)
    )
    d = GpuDriver(gpu_sched(inv, switch_wait_s=5.0))
    d.submit(greq("b1", 2, 0.0, "b", timeout_s=INF))
    d.step()
    d.advance(0.5)
    d.submit(greq("a1", 1, d.now, "a", timeout_s=INF))
    d.step()
    d.advance(1.0)
    d.submit(greq("b2", 2, d.now, "b", timeout_s=INF))
    d.step()
    d.advance(1.0)
    d.submit(greq("b3", 2, d.now, "b", timeout_s=INF))
    d.step()
    assert sorted(d.running) == ["b1", "b2"]  # (b3 waits for a slot)
    d.advance(12.0)  # 14.5 s: past the drain's first window
    d.finish("b1")
    d.step()
    assert d.started("b3") is None, d.log[-4:]  # b is drained for "a": nothing new starts there
    d.finish("b2")  # b idle: evicted, "a" loaded
    d.step()
    d.advance(2.0)
    assert evicted(d) == ["b"] and d.started("a1") is not None and d.started("a1") <= 16.0
