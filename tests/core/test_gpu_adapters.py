"""LoRA adapters as models: placed in a ready replica of their base, loaded there (after
the least recently used adapter that runs nothing, when full), and their requests counted
as their base's demand."""

from __future__ import annotations

from laneway.core import Dispatch, Scheduler
from laneway.core.decisions import Decision, Load, LoadAdapter, UnloadAdapter
from laneway.core.inventory import Inventory, ModelSpec

from .gpu_helpers import GpuDriver, gpu, gpu_sched, greq


def _fleet(gpus: int = 1, max_adapters: int = 1, preload: tuple[str, ...] = ("base",)) -> Inventory:
    models = {
        "base": ModelSpec("base", 16, load_s=30.0, slots=4, max_adapters=max_adapters),
        "sql": ModelSpec("sql", 0.0, load_s=2.0, adapter_of="base"),
        "poem": ModelSpec("poem", 0.0, load_s=1.0, adapter_of="base"),
    }
    return Inventory(tuple(gpu(f"g{i}", 24) for i in range(gpus)), models, preload)


def _kinds(out: list[Decision]) -> list[tuple[str, ...]]:
    return [
        (type(d).__name__, *(str(x) for x in d[:2]))
        for d in out
        if type(d) in (Dispatch, Load, LoadAdapter, UnloadAdapter)
    ]


def test_an_adapter_request_loads_its_adapter_into_a_replica_of_its_base_before_its_dispatch() -> None:
    sched = gpu_sched(_fleet())
    d = GpuDriver(sched)
    (rid,) = d.placement.replicas
    d.submit(greq("q1", 2, 0.0, "sql"))
    assert _kinds(d.step()) == [("LoadAdapter", rid, "sql"), ("Dispatch", "q1", rid)]
    # the next request of it runs there with no load; the base's own requests share the replica
    d.submit(greq("q2", 2, 0.0, "sql"))
    d.submit(greq("b1", 2, 0.0, "base"))
    assert _kinds(d.step()) == [("Dispatch", "q2", rid), ("Dispatch", "b1", rid)]
    sched.check_invariants()


def test_a_full_replica_unloads_its_least_recently_used_idle_adapter_and_never_a_busy_one() -> None:
    sched = gpu_sched(_fleet(max_adapters=1))
    d = GpuDriver(sched)
    (rid,) = d.placement.replicas
    d.submit(greq("q1", 2, 0.0, "sql"))
    d.step()
    # poem waits while sql runs there (the only adapter room is busy), no base load either:
    # the base is in service and no other GPU is free
    d.submit(greq("p1", 2, 1.0, "poem"))
    assert _kinds(d.step()) == []
    d.finish("q1")  # sql runs nothing now: it goes, poem comes
    assert _kinds(d.step()) == [
        ("UnloadAdapter", rid, "sql"),
        ("LoadAdapter", rid, "poem"),
        ("Dispatch", "p1", rid),
    ]
    assert d.placement.adapters.loads == 2 and d.placement.adapters.unloads == 1
    sched.check_invariants()


def test_two_adapters_fit_one_replica_when_its_engine_holds_two() -> None:
    sched = gpu_sched(_fleet(max_adapters=2))
    d = GpuDriver(sched)
    (rid,) = d.placement.replicas
    d.submit(greq("q1", 2, 0.0, "sql"))
    d.submit(greq("p1", 2, 0.0, "poem"))
    out = _kinds(d.step())
    assert out == [
        ("LoadAdapter", rid, "sql"),
        ("Dispatch", "q1", rid),
        ("LoadAdapter", rid, "poem"),
        ("Dispatch", "p1", rid),
    ]


def test_a_replica_holding_the_adapter_is_preferred_to_a_less_loaded_one() -> None:
    inv = _fleet(gpus=2, max_adapters=2, preload=("base", "base"))
    sched = gpu_sched(inv)
    d = GpuDriver(sched)
    first, second = sorted(d.placement.replicas)
    d.submit(greq("b1", 2, 0.0, "base"))
    d.step()
    on = d.worker_of("b1")
    other = second if on == first else first
    d.submit(greq("q1", 2, 0.0, "sql"))  # the least loaded replica takes it (the other runs b1)
    assert _kinds(d.step()) == [("LoadAdapter", other, "sql"), ("Dispatch", "q1", other)]
    d.finish("b1")
    d.submit(greq("b2", 2, 1.0, "base"))
    d.submit(greq("b3", 2, 1.0, "base"))
    d.step()
    d.submit(greq("q2", 2, 2.0, "sql"))  # sql's replica is busier now, but holds it: no load
    assert _kinds(d.step()) == [("Dispatch", "q2", other)]


def test_an_adapters_requests_load_its_base_and_its_wait_estimate_counts_both_loads() -> None:
    sched = gpu_sched(_fleet(preload=()))
    d = GpuDriver(sched)
    est = sched.estimate_wait(2, "sql", 0.0, raw=True)
    assert est >= 30.0 + 2.0  # the base's load, then the adapter's
    d.submit(greq("q1", 2, 0.0, "sql"))
    out = d.step()
    (load,) = [x for x in out if type(x) is Load]
    assert load.model == "base"
    out = d.advance(30.0)
    assert _kinds(out) == [("LoadAdapter", load.replica_id, "sql"), ("Dispatch", "q1", load.replica_id)]
    d.drain()
    assert set(d.ended) == {"q1"}


def test_an_adapter_that_failed_to_load_is_loaded_again_by_its_next_request() -> None:
    sched = gpu_sched(_fleet())
    d = GpuDriver(sched)
    (rid,) = d.placement.replicas
    d.submit(greq("q1", 2, 0.0, "sql"))
    d.step()
    d.finish("q1", failed=True)  # (the runtime ends the request its load failed)
    sched.adapter_failed(rid, "sql", 1.0)
    d.adapters[rid].discard("sql")  # (the driver's books: not held there after all)
    d.submit(greq("q2", 2, 2.0, "sql"))
    assert _kinds(d.step()) == [("LoadAdapter", rid, "sql"), ("Dispatch", "q2", rid)]


def test_an_adapter_and_its_base_are_unplaceable_together_with_a_clear_reason() -> None:
    models = {
        "big": ModelSpec("big", 90, load_s=30.0),
        "big-sql": ModelSpec("big-sql", 0.0, adapter_of="big"),
    }
    sched: Scheduler = gpu_sched(Inventory((gpu("g0", 24),), models))
    rej = sched.submit(greq("q1", 2, 0.0, "big-sql"), 0.0)
    assert rej is not None and rej.reason == "unplaceable"
    assert "adapter 'big-sql' of 'big'" in rej.message and "90 GB" in rej.message


def test_an_urgent_adapter_request_preempts_only_the_adapter_in_its_way() -> None:
    sched = gpu_sched(_fleet(max_adapters=1))
    d = GpuDriver(sched)
    (rid,) = d.placement.replicas
    d.submit(greq("q1", 3, 0.0, "sql"))  # batch work: sql holds the one adapter room
    d.submit(greq("b1", 3, 0.0, "base"))  # and the base's own, beside it
    d.step()
    d.submit(greq("p1", 0, 1.0, "poem"))  # P0 for another adapter: a slot is free, the room is not
    d.now = 1.0
    out = d.step()
    # stopping b1 would free a slot p1 has already: only the sql request is preempted
    assert [(type(x).__name__, x.request_id) for x in out] == [("Preempt", "q1")]
    d.now = 1.5
    d.ack("q1")
    assert _kinds(d.step()) == [
        ("UnloadAdapter", rid, "sql"),
        ("LoadAdapter", rid, "poem"),
        ("Dispatch", "p1", rid),
    ]
    assert d.running.get("b1") == rid  # (never stopped)
    d.drain()
    assert set(d.ended) == {"q1", "b1", "p1"}
