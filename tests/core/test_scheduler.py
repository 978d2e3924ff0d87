"""The scheduler as a whole: events, queries, weighted shares and feedback (mlfq)."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from laneway.core import Dispatch, InvalidTransition, Preempt, State, UnknownRequest

from .helpers import Driver, ids, req, sched

MLFQ = {"mlfq_slice_s": 20.0, "mlfq_levels": 3}


# ---------------------------------------------------------------- events and queries
def test_lifecycle_counters_and_snapshot() -> None:
    d = Driver(sched(2))
    d.submit(req("a", 0, 0.0))
    d.submit(req("b", 2, 0.0))
    d.submit(req("c", 3, 0.0))
    assert (d.sched.live, d.sched.queued, d.sched.free_slots) == (3, 3, 2)
    assert sorted(ids(d.step())) == ["a", "b"]
    assert (d.sched.live, d.sched.queued, d.sched.free_slots) == (3, 1, 0)
    snap = d.sched.snapshot()
    assert snap.queue_depth == {"P0": 0, "P1": 0, "P2": 0, "P3": 1}
    assert snap.running == {"P0": 1, "P1": 0, "P2": 1, "P3": 0}
    assert (snap.slots_total, snap.slots_free, snap.submitted, snap.dispatched) == (2, 0, 3, 2)
    d.now = 5.0
    d.finish("a")
    d.finish("b", failed=True)
    assert ids(d.step()) == ["c"]
    d.cancel("c")
    snap = d.sched.snapshot()
    assert snap.completed == {"P0": 1, "P1": 0, "P2": 0, "P3": 0}
    assert d.sched.counters.failed == [0, 0, 1, 0]
    assert d.sched.counters.cancelled == [0, 0, 0, 1]
    assert d.sched.live == 0 and d.sched.free_slots == 2
    assert math.isinf(d.sched.next_wakeup())


def test_unknown_requests() -> None:
    s = sched(1)
    with pytest.raises(UnknownRequest, match="nope"):
        s.get("nope")
    with pytest.raises(UnknownRequest):
        s.finished("nope", 0.0)
    with pytest.raises(UnknownRequest):
        s.preempted("nope", 0.0)
    assert s.cancel("nope", 0.0) is False
    assert "nope" not in s
    assert str(UnknownRequest("unknown request 'x'")) == "unknown request 'x'"


def test_duplicate_live_id_is_refused() -> None:
    s = sched(1)
    s.submit(req("a", 2), 0.0)
    with pytest.raises(Exception, match="already live"):
        s.submit(req("a", 2), 0.0)
    s.schedule(0.0)
    s.finished("a", 1.0)
    assert s.submit(req("a", 2), 1.0) is None  # ids may be reused once ended


def test_cancel_running_and_preempted_requests_frees_their_slots() -> None:
    d = Driver(sched(2))
    d.submit(req("run", 3, 0.0, est_service_s=100.0))
    d.submit(req("stop", 3, 0.0, est_service_s=100.0))
    d.step()
    d.submit(req("p0", 0, 1.0))
    d.now = 1.0
    (victim,) = ids(d.step(), Preempt)
    other = "run" if victim == "stop" else "stop"
    assert d.sched.get(victim).state is State.PREEMPTED
    assert d.cancel(victim)  # cancelled while the worker was stopping it
    assert ids(d.step()) == ["p0"]  # its slot went to the P0
    assert d.cancel(other)
    assert d.sched.free_slots == 1


def test_a_preempted_request_may_finish_before_it_stops() -> None:
    d = Driver(sched(1))
    d.submit(req("p3", 3, 0.0, est_service_s=100.0))
    d.step()
    d.submit(req("p0", 0, 1.0))
    d.now = 1.0
    assert ids(d.step()) == ["p3"]
    d.finish("p3")  # the worker finished it at the token boundary
    assert d.sched.get("p0").state is State.QUEUED
    assert ids(d.step()) == ["p0"]
    with pytest.raises(InvalidTransition):
        d.sched.preempted("p0", 2.0)


def test_next_wakeup_and_schedule_without_events() -> None:
    d = Driver(sched(1))
    assert math.isinf(d.sched.next_wakeup())
    assert d.step() == []
    d.submit(req("busy", 1, 0.0, est_service_s=100.0))
    d.step()
    d.submit(req("p0", 0, 0.0))
    d.step()
    assert d.sched.next_wakeup() == 30.0  # the P0 queue timeout
    assert d.step() == []  # nothing changed: nothing to do


def test_requests_keep_queue_time_accounts() -> None:
    d = Driver(sched(1))
    d.submit(req("busy", 1, 0.0, est_service_s=100.0))
    d.submit(req("p3", 3, 0.0, est_service_s=100.0))
    d.step()
    d.now = 10.0
    d.finish("busy")
    d.step()
    r = d.sched.get("p3")
    assert (r.first_start_s, r.queued_total_s, r.started) == (10.0, 10.0, True)
    d.now = 12.0
    d.submit(req("p0", 0, 12.0))
    d.step()
    d.ack("p3")
    d.step()
    d.now = 20.0
    d.finish("p0")
    d.step()
    assert r.queued_total_s == pytest.approx(18.0)
    assert r.run_s == pytest.approx(2.0)


# ---------------------------------------------------------------- weighted shares (mlfq)
def test_shares_are_work_conserving() -> None:
    d = Driver(sched(6, "mlfq", **MLFQ))
    for i in range(10):
        d.submit(req(f"p3-{i}", 3, 0.0))
    assert len(ids(d.step())) == 6  # the only class with work gets every slot


def test_shares_follow_the_weights_when_backlogged() -> None:
    d = Driver(sched(12, "mlfq", **MLFQ))
    for i in range(40):
        d.submit(req(f"p2-{i}", 2, 0.0, est_service_s=5.0))
        d.submit(req(f"p3-{i}", 3, 0.0, est_service_s=5.0))
    first = Counter(d.sched.get(x).priority for x in ids(d.step()))
    assert first == {2: 8, 3: 4}  # weights 2 : 1
    # keep finishing the oldest run: refills keep to the split
    started: Counter[int] = Counter()
    for _ in range(30):
        d.now += 1.0
        d.finish(next(iter(d.running)))
        for rid in ids(d.step(), Dispatch):
            started[d.sched.get(rid).priority] += 1
    ratio = started[2] / started[3]
    assert ratio >= 1.5 and ratio <= 2.5, started


def test_shares_give_unused_share_to_others() -> None:
    d = Driver(sched(4, "mlfq", **MLFQ))
    d.submit(req("p2", 2, 0.0, est_service_s=5.0))  # its share would be 2 or 3 of 4 slots
    for i in range(10):
        d.submit(req(f"p3-{i}", 3, 0.0, est_service_s=5.0))
    got = Counter(d.sched.get(x).priority for x in ids(d.step()))
    assert got == {2: 1, 3: 3}


def test_time_slice_demotion_yields_to_shorter_work() -> None:
    d = Driver(sched(1, "mlfq", **MLFQ))
    d.submit(req("long", 3, 0.0))  # no size hint: starts at the top level
    assert ids(d.step()) == ["long"]
    assert d.sched.next_wakeup() == 20.0
    d.now = 1.0
    d.submit(req("short", 3, 1.0, est_service_s=2.0))
    assert d.step() == []  # no preemption right inside a class
    out = d.advance(19.0)
    assert out == [Preempt("long", "w0", "checkpoint", 3)]
    assert d.sched.get("long").level == 1
    d.ack("long")
    assert d.step() == [Dispatch("short", "w0", None)]
    d.now = 22.0
    d.finish("short")
    assert d.step() == [Dispatch("long", "w0", "checkpoint")]


def test_time_slice_without_shorter_work_keeps_running() -> None:
    d = Driver(sched(1, "mlfq", **MLFQ))
    d.submit(req("long", 3, 0.0))
    d.step()
    assert d.advance(20.0) == []
    assert d.sched.get("long").level == 1
    assert d.sched.next_wakeup() == pytest.approx(60.0)  # the next slice is twice as long
    assert d.advance(40.0) == []
    assert d.sched.get("long").level == 2


def test_size_hint_places_long_work_low_and_lets_it_finish() -> None:
    d = Driver(sched(1, "mlfq", **MLFQ))
    d.submit(req("big", 3, 0.0, est_service_s=100.0))
    assert d.sched.get("big").level == 2  # over 60 s of work: the bottom level
    d.step()
    d.submit(req("small", 3, 1.0, est_service_s=2.0))
    assert d.sched.get("small").level == 0
    d.advance(90.0)  # slices pass, but big has not outrun its hint
    assert not any(type(x) is Preempt for _, x in d.log)


def test_no_time_slices_for_classes_that_are_never_preempted() -> None:
    d = Driver(sched(1, "mlfq", **MLFQ))
    d.submit(req("p1", 1, 0.0))
    d.step()
    d.submit(req("p1-short", 1, 1.0, est_service_s=1.0))
    assert math.isinf(d.sched.next_wakeup()) or d.sched.next_wakeup() >= 61.0
    d.advance(50.0)
    assert not any(type(x) is Preempt for _, x in d.log)


def test_mlfq_does_not_dispatch_what_it_preempts_in_the_same_step() -> None:
    """Weighted shares do not hand a slot to a P3 (its class furthest below its
    share) while a P0 that may preempt it waits: it would be taken back at once."""
    d = Driver(sched(2, "mlfq", **MLFQ))
    d.submit(req("a", 0, 0.0, est_service_s=100.0))
    d.submit(req("b", 0, 0.0, est_service_s=100.0))
    d.step()
    d.now = 1.0
    d.submit(req("c", 0, 1.0, est_service_s=100.0))
    d.submit(req("d", 3, 1.0, est_service_s=100.0))
    d.now = 2.0
    d.finish("a")
    out = d.step()
    assert not set(ids(out, Dispatch)) & set(ids(out, Preempt)), out
