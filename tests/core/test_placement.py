"""How a slot placement spreads work over workers that may all take it."""

from __future__ import annotations

import pytest

from laneway.core import ConfigError, Dispatch, Scheduler, SchedulerConfig, WorkerSpec

from .helpers import Driver, req


def two_engines(placement: str = "least-loaded", slots: int = 4) -> Driver:
    cfg = SchedulerConfig(placement=placement)
    return Driver(Scheduler([WorkerSpec("a", slots), WorkerSpec("b", slots)], cfg))


def placed(d: Driver, *rids: str) -> list[str]:
    for rid in rids:
        d.submit(req(rid, 2, d.now))
    return [x.worker_id for x in d.step() if isinstance(x, Dispatch)]


def test_least_loaded_spreads_over_engines_of_several_slots() -> None:
    """Two engines of 4 slots and 4 requests run 2 and 2, not 4 and none (found: the
    worker idle longest took every request while it had a free slot)."""
    d = two_engines()
    assert placed(d, "r0", "r1", "r2", "r3") == ["a", "b", "a", "b"]


def test_least_loaded_sends_work_where_a_slot_came_free() -> None:
    d = two_engines()
    assert placed(d, "r0", "r1", "r2", "r3") == ["a", "b", "a", "b"]
    d.finish("r1")  # b now runs 1 of 4, a 2 of 4
    assert placed(d, "r4") == ["b"]
    d.finish("r0")
    d.finish("r2")  # a runs none
    assert placed(d, "r5", "r6") == ["a", "a"]  # (then a and b run 1 and 2: a again)


def test_least_loaded_weighs_the_share_of_slots() -> None:
    """A worker of 8 slots running 2 is less loaded than one of 2 running 1."""
    d = Driver(Scheduler([WorkerSpec("small", 2), WorkerSpec("big", 8)]))
    assert placed(d, "r0", "r1") == ["small", "big"]
    assert placed(d, "r2", "r3") == ["big", "big"]  # big at 1/8 and 2/8, small at 1/2


def test_round_robin_goes_in_turn_whatever_the_workers_run() -> None:
    d = two_engines("round-robin")
    assert placed(d, "r0", "r1", "r2") == ["a", "b", "a"]
    d.finish("r0")
    d.finish("r2")  # a runs nothing, b one: still b's turn
    assert placed(d, "r3", "r4") == ["b", "a"]


def test_round_robin_skips_a_full_or_failed_worker() -> None:
    d = two_engines("round-robin", slots=1)
    assert placed(d, "r0", "r1") == ["a", "b"]
    d.finish("r1")
    assert placed(d, "r2") == ["b"]  # a's turn, but a is full
    d.finish("r0")
    d.finish("r2")
    d.sched.set_available("a", False)
    assert placed(d, "r3") == ["b"]
    d.finish("r3")
    d.sched.set_available("a", True)
    assert placed(d, "r4", "r5") == ["a", "b"]


def test_an_unknown_placement_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="placement: must be one of least-loaded, round-robin"):
        SchedulerConfig(placement="random")
