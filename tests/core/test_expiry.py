"""Queue timeouts: per class, per request, never for started work, none under fifo."""

from __future__ import annotations

import math

import pytest

from laneway.core import Dispatch, Reject, Request, State
from laneway.core.expiry import Expiry

from .helpers import Driver, ids, req, sched


def _busy(policy: str = "laneway", **cfg: object) -> Driver:
    """One slot held by a long, non-preemptible P1 request ``busy``."""
    d = Driver(sched(1, policy, **cfg))
    d.submit(req("busy", 1, 0.0, est_service_s=1000.0))
    assert ids(d.step()) == ["busy"]
    return d


@pytest.mark.parametrize(("cls", "timeout"), [(0, 30.0), (1, 60.0), (2, 300.0)])
def test_class_timeout(cls: int, timeout: float) -> None:
    d = _busy()
    d.now = 1.0
    d.submit(req("r", cls, 1.0))
    assert d.step() == []
    assert d.sched.next_wakeup() == pytest.approx(1.0 + timeout)
    assert d.advance(timeout - 0.01) == []
    out = d.advance(0.01)
    assert len(out) == 1
    rej = out[0]
    assert type(rej) is Reject
    assert rej.request_id == "r"
    assert rej.reason == "queue_timeout"
    assert rej.estimated_wait_s > 0  # the slot is held for ~1000 s more
    assert rej.retry_after_s == pytest.approx(max(rej.estimated_wait_s, 1.0))
    assert d.ended["r"] == "expired"
    assert "r" not in d.sched
    assert d.sched.counters.rejections["queue_timeout"] == 1


def test_p3_has_no_timeout() -> None:
    d = _busy()
    d.submit(req("p3", 3, 0.0))
    assert math.isinf(d.sched.next_wakeup())
    assert d.advance(100_000.0) == []
    assert d.sched.get("p3").state is State.QUEUED


def test_expired_request_state_and_order() -> None:
    d = _busy()
    d.submit(req("a", 0, 0.0))
    d.submit(req("b", 0, 10.0))
    d.submit(req("c", 2, 5.0))
    d.now = 40.0
    out = d.step()
    assert [(type(x), x.request_id) for x in out] == [(Reject, "a"), (Reject, "b")]
    r = d.sched.get("c")
    assert r.state is State.QUEUED
    assert r.deadline_s == 305.0


@pytest.mark.parametrize("own", [5.0, 120.0])
def test_per_request_timeout_overrides_the_class(own: float) -> None:
    d = _busy()
    d.submit(req("own", 0, 0.0, timeout_s=own))
    d.submit(req("default", 0, 0.0))
    assert d.sched.get("own").deadline_s == own
    expected = sorted([(own, "own"), (30.0, "default")])
    for deadline, rid in expected:
        assert rid not in d.ended
        d.advance(deadline - 0.01 - d.now)
        assert rid not in d.ended
        out = d.advance(0.01)
        assert ids(out) == [rid]
        assert out[0].reason == "queue_timeout"  # type: ignore[union-attr]


def test_per_request_timeout_can_be_infinite() -> None:
    d = _busy()
    d.submit(req("patient", 0, 0.0, timeout_s=math.inf))
    d.advance(10_000.0)
    assert d.sched.get("patient").state is State.QUEUED


def test_per_request_timeout_on_a_class_without_one() -> None:
    d = _busy()
    d.submit(req("batch", 3, 0.0, timeout_s=50.0))
    assert d.sched.next_wakeup() == 50.0
    assert d.advance(49.0) == []
    assert ids(d.advance(1.0)) == ["batch"]


def test_a_request_that_started_once_is_never_expired() -> None:
    d = Driver(sched(1))
    d.submit(req("p2", 2, 0.0, est_service_s=10_000.0))
    assert ids(d.step()) == ["p2"]
    d.now = 1.0
    d.submit(req("p0", 0, 1.0, est_service_s=10_000.0))
    d.step()
    d.ack("p2")
    assert ids(d.step()) == ["p0"]
    # the P2 waits behind the P0 far past its 300 s timeout, and past the P0's
    d.advance(5_000.0)
    assert d.sched.get("p2").state is State.QUEUED
    assert "p2" not in d.ended
    d.finish("p0")
    assert d.step() == [Dispatch("p2", "w0", "checkpoint")]


def test_fifo_has_no_timeouts() -> None:
    d = _busy("fifo")
    d.submit(req("p0", 0, 0.0))
    d.submit(req("own", 2, 0.0, timeout_s=1.0))
    assert math.isinf(d.sched.next_wakeup())
    assert d.advance(10_000.0) == []
    assert d.sched.queued == 2


def test_fifo_refuses_no_arrival_for_a_timeout_it_would_never_reach() -> None:
    """Past the expected wait of its timeout an arrival is refused at once (it would time
    out in the queue) — not under fifo, which has no timeouts: there only ``max_wait_s``
    bounds it (the server refused it, the simulator queued it)."""
    for policy, refused in (("laneway", True), ("fifo", False)):
        d = _busy(policy, max_wait_s=5000.0)
        got = d.sched.submit(req("own", 2, 0.0, timeout_s=1.0), 0.0)
        assert (got is not None and got.reason == "queue_timeout") is refused, (policy, got)
        got = d.sched.submit(req("p0", 0, 0.0), 0.0)  # (P0's class timeout)
        assert (got is not None) is refused, (policy, got)
        if not refused:
            assert d.sched.queued == 2
    d = _busy("fifo", max_wait_s=10.0)  # the bound by the wait still holds
    got = d.sched.submit(req("long", 2, 0.0), 0.0)
    assert got is not None and got.reason == "overloaded", got


def test_cancelled_and_dispatched_requests_do_not_expire() -> None:
    d = Driver(sched(1))
    d.submit(req("runs", 0, 0.0, est_service_s=100.0))
    d.submit(req("gone", 0, 0.0))
    d.step()
    assert d.cancel("gone")
    assert not d.cancel("gone")
    d.advance(100.0)
    assert d.ended == {"gone": "cancelled"}


def test_expiry_structure_directly() -> None:
    e = Expiry([10.0, None])
    a = Request("a", 0, 0.0)
    b = Request("b", 0, 1.0, timeout_s=3.0)
    c = Request("c", 1, 0.0)
    for r in (a, b, c):
        r.state = State.QUEUED
        e.add(r, r.arrival_s)
    assert (a.deadline_s, b.deadline_s, c.deadline_s) == (10.0, 4.0, math.inf)
    assert e.next_deadline() == 4.0
    assert e.due(3.9) == []
    assert e.due(4.0) == [b]
    b.state = State.EXPIRED
    assert e.newest(0) is a
    assert e.newest(1) is c
    assert e.due(10.0) == [a]
    a.state = State.EXPIRED
    assert e.newest(0) is None
    assert math.isinf(e.next_deadline())
    disabled = Expiry([10.0, None], enabled=False)
    d = Request("d", 0, 0.0, timeout_s=1.0)
    d.state = State.QUEUED
    disabled.add(d, 0.0)
    assert math.isinf(d.deadline_s)
    assert disabled.due(1e9) == []


def test_expiry_without_shedding_keeps_deadlines_only() -> None:
    e = Expiry([10.0, None], shedding=False)
    a = Request("a", 0, 0.0)
    c = Request("c", 1, 0.0)
    for r in (a, c):
        r.state = State.QUEUED
        e.add(r, r.arrival_s)
    assert (a.deadline_s, c.deadline_s) == (10.0, math.inf)
    assert e.newest(0) is None and e.newest(1) is None
    assert not any(e.fresh)
    assert e.due(10.0) == [a]


def test_out_of_order_arrivals_expire_on_time() -> None:
    d = _busy()
    d.now = 10.0
    d.submit(req("late", 0, 10.0))  # deadline 40
    d.submit(req("early", 0, 0.0))  # arrived first (say, at a gateway): deadline 30
    assert d.sched.next_wakeup() == 30.0
    out = d.advance(20.0)
    assert ids(out) == ["early"]
    assert ids(d.advance(10.0)) == ["late"]


def test_requests_with_long_own_timeouts_can_still_be_shed() -> None:
    # batch lines carry their batch's completion window: they outlive the P2 default
    d = _busy(max_queued_total=2)
    d.submit(req("batch-a", 2, 0.0, timeout_s=86_400.0))
    d.submit(req("batch-b", 2, 0.0, timeout_s=math.inf))
    d.advance(400.0)  # past the P2 default of 300 s
    assert d.sched.queued == 2
    assert d.submit(req("p0", 0, d.now)) is None  # sheds the newest P2
    assert ids(d.step()) == ["batch-b"]
    assert d.ended["batch-b"] == "rejected"
