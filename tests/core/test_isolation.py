"""Workers marked ``isolate`` run urgent work with nothing it may preempt beside it."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laneway.core import Dispatch, Preempt, Scheduler, SchedulerConfig, WorkerSpec
from laneway.core.classes import ClassTable
from laneway.core.request import State

from .helpers import Driver, ids, req


def two(isolate: bool = True, slots: int = 4, hold_s: float = 0.0, policy: str = "laneway") -> Driver:
    """Two workers of ``slots`` slots, ``a`` isolated (or not), ``b`` not."""
    workers = [WorkerSpec("a", slots, isolate=isolate), WorkerSpec("b", slots)]
    return Driver(Scheduler(workers, SchedulerConfig(hold_s=hold_s), policy))


def one(slots: int = 4, hold_s: float = 0.0) -> Driver:
    return Driver(Scheduler([WorkerSpec("a", slots, isolate=True)], SchedulerConfig(hold_s=hold_s)))


def test_an_urgent_start_stops_the_batch_work_beside_it_and_the_batch_waits_until_it_ends() -> None:
    d = one()
    for i in range(3):
        d.submit(req(f"p3-{i}", 3))
    assert ids(d.step(), Dispatch) == ["p3-0", "p3-1", "p3-2"]
    d.now = 1.0
    d.submit(req("p0", 0, 1.0))
    out = d.step()
    # the P0 takes the free slot at once; the three P3s beside it stop
    assert ids(out, Dispatch) == ["p0"]
    assert sorted(ids(out, Preempt)) == ["p3-0", "p3-1", "p3-2"]
    assert all(d_.for_class == 0 for d_ in out if isinstance(d_, Preempt))
    for rid in sorted(d.stopping):
        d.ack(rid)
    assert d.step() == []  # three slots free, and no P3 starts beside the P0
    assert d.sched.free_slots == 3
    d.now = 2.0
    d.finish("p0")
    assert sorted(ids(d.step(), Dispatch)) == ["p3-0", "p3-1", "p3-2"]  # resumed once it is alone


def test_more_urgent_work_may_run_together_and_classes_without_rights_are_kept_from_nothing() -> None:
    d = one()
    d.submit(req("p1", 1))
    d.submit(req("p2", 2))  # P1 may not preempt P2: they run together
    assert ids(d.step(), Dispatch) == ["p1", "p2"]
    d.submit(req("p0", 0))
    out = d.step()
    assert ids(out, Dispatch) == ["p0"] and ids(out, Preempt) == ["p2"]  # (P0 may preempt P2)
    d.submit(req("p0b", 0))
    d.submit(req("p3", 3))
    assert ids(d.step(), Dispatch) == ["p0b"]  # the P3 waits: P0 and P1 may both preempt it


def test_work_that_may_not_be_stopped_stays_and_urgent_work_never_waits_for_isolation() -> None:
    d = one(slots=2)
    d.submit(req("fixed", 3, preemptible=False))
    assert ids(d.step(), Dispatch) == ["fixed"]
    d.submit(req("p0", 0))
    out = d.step()
    assert ids(out, Dispatch) == ["p0"] and not ids(out, Preempt)
    assert d.sched.get("fixed").state is State.RUNNING


def test_batch_work_goes_to_the_worker_that_runs_no_urgent_work() -> None:
    d = two(slots=2)
    d.submit(req("p0", 0))
    assert ids(d.step(), Dispatch) == ["p0"]
    assert d.running["p0"] == "a"
    for i in range(3):
        d.submit(req(f"p3-{i}", 3))
    d.step()
    # b takes two; none starts beside the P0 on a
    assert sorted(d.running.items()) == [("p0", "a"), ("p3-0", "b"), ("p3-1", "b")]


def test_batch_work_leaves_the_last_slot_of_an_isolated_worker_to_urgent_work() -> None:
    d = one(slots=4)
    for i in range(5):
        d.submit(req(f"p3-{i}", 3))
    assert len(ids(d.step(), Dispatch)) == 3  # the fourth slot is kept
    d.submit(req("p1", 1))  # (urgent work takes it)
    out = d.step()
    assert ids(out, Dispatch) == ["p1"] and len(ids(out, Preempt)) == 3
    single = Driver(Scheduler([WorkerSpec("a", 1, isolate=True)], SchedulerConfig()))
    single.submit(req("p3", 3))
    assert ids(single.step(), Dispatch) == ["p3"]  # (one slot: nothing to keep; P0 preempts it)


def test_urgent_work_goes_where_it_stops_batch_work_before_it_shares_an_engine_with_urgent_work() -> None:
    workers = [WorkerSpec("a", 4, isolate=True), WorkerSpec("b", 4, isolate=True)]
    d = Driver(Scheduler(workers, SchedulerConfig()))
    d.submit(req("p0a", 0))
    d.step()
    for i in range(3):
        d.submit(req(f"p3-{i}", 3))
    d.step()
    assert sorted(w for r, w in d.running.items() if r.startswith("p3")) == ["b", "b", "b"]
    d.submit(req("p0b", 0))
    out = d.step()  # b runs three P3s (all of which it would stop), a one P0: b
    assert ids(out, Dispatch) == ["p0b"] and d.running["p0b"] != d.running["p0a"]
    assert sorted(ids(out, Preempt)) == ["p3-0", "p3-1", "p3-2"]


def test_batch_work_kept_off_an_isolated_worker_is_not_told_a_slot_is_free_for_it() -> None:
    d = one(slots=4)
    d.submit(req("p0", 0, est_service_s=5.0))
    d.step()
    wait, why = d.sched.estimate_range(3, None, d.now)
    assert wait > 0 and why.basis != "now", (wait, why)  # (three slots free, none of them for a P3)
    wait, why = d.sched.estimate_range(1, None, d.now)
    assert wait == 0 and why.basis == "now"  # (a P1 may start beside the P0)
    d.now = 1.0
    d.finish("p0")
    d.now = 2.0
    d.step()
    wait, why = d.sched.estimate_range(3, None, d.now)
    assert wait == 0 and why.basis == "now"


def test_a_worker_not_isolated_runs_batch_beside_urgent_work_as_before() -> None:
    d = Driver(Scheduler([WorkerSpec("a", 4)], SchedulerConfig()))
    d.submit(req("p3", 3))
    d.step()
    d.submit(req("p0", 0))
    out = d.step()
    assert ids(out, Dispatch) == ["p0"] and not ids(out, Preempt)
    d.submit(req("p3b", 3))
    assert ids(d.step(), Dispatch) == ["p3b"]


def test_batch_work_keeps_off_for_hold_s_after_the_urgent_work_ended_then_starts() -> None:
    d = one(hold_s=0.5)
    d.submit(req("p0", 0))
    d.step()
    d.submit(req("p3", 3))
    assert d.step() == []
    d.now = 1.0
    d.finish("p0")
    assert d.step() == []
    assert d.sched.next_wakeup() == 1.5
    d.now = 1.2
    d.submit(req("p0b", 0, 1.2))  # the agent's next step: it finds the worker free of batch work
    out = d.step()
    assert ids(out, Dispatch) == ["p0b"] and not ids(out, Preempt)
    d.now = 2.0
    d.finish("p0b")
    d.step()
    out = d.advance(0.6)
    assert ids(out, Dispatch) == ["p3"]


def test_a_p1_ending_keeps_off_only_what_p1_may_preempt() -> None:
    d = one(hold_s=0.5)
    d.submit(req("p1", 1))
    d.step()
    d.now = 1.0
    d.finish("p1")
    d.submit(req("p2", 2, 1.0))
    d.submit(req("p3", 3, 1.0))
    assert ids(d.step(), Dispatch) == ["p2"]  # P1 may not preempt P2; the P3 waits the hold


def test_a_p1_ending_after_a_p0_does_not_keep_off_what_only_the_p0_may_preempt_for_longer() -> None:
    """Found in a trial: each P1 ending within a P0's quiet time renewed it, so steady P1
    traffic kept a P2 off (20 s) though P1 may not preempt P2."""
    d = one(hold_s=0.5)
    d.submit(req("p0", 0))
    d.step()
    d.now = 1.0
    d.finish("p0")  # P2 and P3 keep off until 1.5
    d.submit(req("p1", 1, 1.0))
    d.step()
    d.now = 1.4
    d.finish("p1")  # P3 keeps off until 1.9; P2 still until 1.5
    d.submit(req("p2", 2, 1.4))
    d.submit(req("p3", 3, 1.4))
    assert d.step() == []
    assert d.sched.next_wakeup() == 1.5
    out = d.advance(0.15)
    assert ids(out, Dispatch) == ["p2"]
    assert d.sched.next_wakeup() == 1.9
    assert ids(d.advance(0.4), Dispatch) == ["p3"]


def test_a_class_that_may_not_be_preempted_is_kept_off_all_the_same_but_never_stopped() -> None:
    table = list(ClassTable().classes)
    table[3] = dataclasses.replace(table[3], preemptible=False)
    config = SchedulerConfig(classes=ClassTable(tuple(table)))
    d = Driver(Scheduler([WorkerSpec("a", 4, isolate=True)], config))
    for i in range(5):
        d.submit(req(f"p3-{i}", 3))
    assert len(ids(d.step(), Dispatch)) == 3  # (the last slot kept: P0 may preempt P3 in the table)
    d.submit(req("p0", 0))
    out = d.step()
    assert ids(out, Dispatch) == ["p0"] and not ids(out, Preempt)  # (they may not be stopped)
    d.finish("p3-0")
    assert d.step() == []  # but no P3 starts beside the P0


def test_among_equal_workers_urgent_work_goes_to_an_isolated_one_and_batch_work_not() -> None:
    for order in (["plain", "iso"], ["iso", "plain"]):
        specs = {"iso": WorkerSpec("iso", 4, isolate=True), "plain": WorkerSpec("plain", 4)}
        d = Driver(Scheduler([specs[n] for n in order], SchedulerConfig()))
        d.submit(req("p0", 0))
        d.submit(req("p3", 3))
        d.step()
        assert d.running == {"p0": "iso", "p3": "plain"}, order


def test_under_fifo_isolation_keeps_nothing_apart() -> None:
    workers = [WorkerSpec("a", 2, isolate=True)]
    d = Driver(Scheduler(workers, SchedulerConfig(), "fifo"))
    d.submit(req("p3", 3))
    d.submit(req("p0", 0))
    assert ids(d.step(), Dispatch) == ["p3", "p0"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["submit", "submit", "submit", "finish", "ack", "advance"]),
            st.integers(0, 3),
            st.floats(0.0, 0.6),
            st.integers(0, 4).map(lambda x: x == 0),  # (a fifth may not be preempted)
        ),
        min_size=5,
        max_size=60,
    ),
    st.integers(1, 4),
    st.sampled_from([0.0, 0.25]),
)
def test_isolated_workers_never_start_work_beside_what_may_preempt_it_and_every_request_ends(
    steps: list[tuple[str, int, float, bool]], n_slots: int, hold_s: float
) -> None:
    """Whatever arrives and ends: no request starts on an isolated worker beside a running
    one that may preempt it; after each step, what runs there beside such a request is
    being stopped or may not be; urgent work never waits while a slot is free; the
    scheduler's invariants hold and every request ends exactly once."""
    d = two(slots=n_slots, hold_s=hold_s)
    victims = d.sched.tables.victims
    rights = d.sched.tables.rights_of
    n = 0
    for kind, cls, dt, fixed in steps:
        if kind == "submit":
            d.submit(req(f"r{n}", cls, d.now, preemptible=not fixed))
            n += 1
        elif kind == "finish":
            live = sorted(r for r in d.running if r not in d.stopping)
            if live:
                d.finish(live[cls % len(live)])
        elif kind == "ack":
            if d.stopping:
                d.ack(sorted(d.stopping)[0])
        else:
            d.now += dt
        before = dict(d.running)
        out = d.step()
        for dec in out:
            if isinstance(dec, Dispatch) and dec.worker_id == "a":
                beside = [
                    d.sched.get(r)
                    for r, w in before.items()
                    if w == "a" and r not in d.stopping and r in d.sched
                ]
                started = d.sched.get(dec.request_id)
                assert not any(started.cls in rights[b.cls] for b in beside), (dec, beside)
        a = d.sched.workers["a"]
        urgent = [r for r in a.running.values() if r.state is State.RUNNING and victims[r.cls]]
        for r in a.running.values():
            if r.state is State.RUNNING and any(r.cls in victims[u.cls] for u in urgent):
                assert not d.sched.preemptor.may_stop(r, d.now), r  # (stopping, or it may not be)
        if d.sched.lanes.class_count[0]:  # a P0 waits only while no slot is free
            assert d.sched.free_slots == 0
    d.drain()
    assert sorted(d.ended) == sorted(d.submitted)


def test_batch_works_estimate_on_a_worker_kept_quiet_after_urgent_work_is_its_quiet_time() -> None:
    """After urgent work ended on an isolated worker, batch work keeps off it for ``hold_s``
    while nothing runs there: its estimate is that quiet time, not "no worker is up"."""
    d = one(slots=2, hold_s=0.5)
    d.submit(req("p0", 0))
    assert ids(d.step(), Dispatch) == ["p0"]
    d.now = 1.0
    d.finish("p0")
    assert d.step() == []
    d.now = 1.1
    wait, rng = d.sched.estimate_range(3, None, d.now)
    # (0.4 s, stretched by the urgent work that may arrive meanwhile)
    assert 0.4 <= wait < 1.0 and rng.basis != "none", (wait, rng)
    d.submit(req("p3", 3, 1.1))
    assert d.step() == []  # (kept off until 1.5)
    wait, _ = d.sched.estimate_range(3, None, d.now)  # behind the queued one: still finite
    assert 0.4 <= wait < 10.0, wait
    d.now = 1.5
    assert ids(d.step(), Dispatch) == ["p3"]


def test_the_slots_kept_from_batch_work_are_averaged_over_the_last_minute() -> None:
    """An isolated worker keeps batch work off all its slots while urgent work runs there:
    of 30 s with a P0 running, then 30 s with none, the share kept is the average over
    about a minute (an exponential one: ``d / (1 + d)``, ``d = exp(-30 / 60)``)."""
    d = one(slots=4)
    iso = d.sched.isolation
    assert iso is not None
    d.submit(req("p0", 0))
    assert ids(d.step(), Dispatch) == ["p0"]
    assert iso.kept_share(3) == 0.0  # (nothing seen yet)
    d.now = 30.0
    d.finish("p0")
    d.step()
    assert iso.kept_share(3) == pytest.approx(1.0)  # (all of it, all this time)
    d.now = 60.0
    d.step()
    decay = math.exp(-0.5)
    assert iso.kept_share(3) == pytest.approx(decay / (1 + decay))
    assert iso.kept_share(0) == 0.0  # (nothing outranks P0)
