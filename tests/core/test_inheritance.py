"""Priority inheritance: a request others depend on runs at its most urgent waiter's class."""

from __future__ import annotations

from laneway.core import Dispatch, Preempt, State

from .helpers import Driver, ids, req, sched

LONG = 1000.0


def _busy(n_slots: int = 1) -> Driver:
    """All slots held by long, non-preemptible P1 requests ``busy0`` …"""
    d = Driver(sched(n_slots, aging_interval_s=None))
    for i in range(n_slots):
        d.submit(req(f"busy{i}", 1, 0.0, est_service_s=LONG))
    assert len(d.step()) == n_slots
    return d


def test_dependency_is_dispatched_at_its_waiters_rank() -> None:
    d = _busy()
    d.submit(req("p2", 2, 1.0))
    d.submit(req("p1", 1, 2.0))
    d.submit(req("dep", 3, 3.0))
    assert d.sched.get("dep").cls == 3
    d.submit(req("waiter", 0, 4.0, depends_on=("dep",)))
    dep = d.sched.get("dep")
    assert (dep.cls, dep.inherited, dep.priority) == (0, 0, 3)
    assert dep.waiters == {"waiter"}
    d.now = 5.0
    d.finish("busy0")
    assert ids(d.step()) == ["dep"]  # ahead of P1 and P2, and of its (later) waiter


def test_inherited_request_is_not_preempted_while_the_waiter_lives() -> None:
    d = Driver(sched(1, aging_interval_s=None))
    d.submit(req("dep", 3, 0.0, est_service_s=LONG))
    d.submit(req("waiter", 0, 0.0, depends_on=("dep",)))
    assert ids(d.step()) == ["dep"]
    d.now = 1.0
    d.submit(req("urgent", 0, 1.0))
    assert d.advance(20.0) == []
    assert d.sched.get("dep").state is State.RUNNING


def test_inheritance_drops_back_when_the_waiter_ends() -> None:
    d = Driver(sched(1, aging_interval_s=None))
    d.submit(req("dep", 3, 0.0, est_service_s=LONG))
    d.submit(req("waiter", 0, 0.0, depends_on=("dep",)))
    assert ids(d.step()) == ["dep"]
    d.now = 1.0
    assert d.cancel("waiter")
    dep = d.sched.get("dep")
    assert (dep.cls, dep.inherited) == (3, None)
    d.submit(req("urgent", 0, 1.0))
    assert d.step() == [Preempt("dep", "w0", "checkpoint", 0)]


def test_queued_dependency_drops_back_when_its_waiter_finishes() -> None:
    d = _busy(2)
    d.submit(req("dep", 3, 1.0))
    d.submit(req("p2", 2, 2.0))
    d.submit(req("waiter", 0, 0.5, depends_on=("dep",)))
    d.finish("busy0")
    assert ids(d.step()) == ["waiter"]  # the waiter arrived first
    d.finish("waiter")
    assert d.sched.get("dep").cls == 3
    assert ids(d.step()) == ["p2"]  # back in P3, behind the P2


def test_most_urgent_waiter_wins_and_the_next_takes_over() -> None:
    d = _busy()
    d.submit(req("dep", 3, 0.0))
    d.submit(req("w1", 1, 0.0, depends_on=("dep",)))
    assert d.sched.get("dep").cls == 1
    d.submit(req("w0", 0, 0.0, depends_on=("dep",)))
    assert d.sched.get("dep").cls == 0
    d.cancel("w0")
    assert d.sched.get("dep").cls == 1
    d.cancel("w1")
    assert d.sched.get("dep").cls == 3
    assert d.sched.get("dep").inherited is None


def test_inheritance_follows_chains() -> None:
    d = _busy()
    d.submit(req("c", 3, 0.0))
    d.submit(req("b", 2, 0.0, depends_on=("c",)))
    assert d.sched.get("c").cls == 2
    d.submit(req("a", 0, 0.0, depends_on=("b",)))
    assert [d.sched.get(x).cls for x in "abc"] == [0, 0, 0]
    d.cancel("a")
    assert [d.sched.get(x).cls for x in "bc"] == [2, 2]


def test_waiter_on_a_request_that_is_not_live() -> None:
    d = _busy()
    assert d.submit(req("waiter", 0, 0.0, depends_on=("nobody",))) is None
    assert d.sched.get("waiter").state is State.QUEUED


def test_dependency_submitted_after_its_waiter_inherits() -> None:
    """A dependency submitted after its waiter still inherits its rank."""
    d = _busy()
    d.submit(req("waiter", 0, 0.0, depends_on=("dep",)))
    d.submit(req("p2", 2, 1.0))
    d.submit(req("dep", 3, 2.0))
    assert d.sched.get("dep").cls == 0


def test_inherited_request_with_a_drain_claim_is_not_preempted() -> None:
    """A P3 that a P1 is draining, and that a P0 then starts to depend on, is not
    preempted when the drain claim runs out: it runs at P0 rank now."""
    d = Driver(sched(1, aging_interval_s=None))
    d.submit(req("dep", 3, 0.0, est_service_s=0.2))
    assert ids(d.step()) == ["dep"]
    d.now = 0.15
    d.submit(req("p1", 1, 0.15))
    assert d.step() == []  # ~0.05 s left: the P1 drains it
    assert d.sched.get("dep").claimed_for == 1
    d.submit(req("waiter", 0, 0.15, depends_on=("dep",)))
    assert d.sched.get("dep").cls == 0
    d.advance(5.0)
    assert not any(type(x) is Preempt for _, x in d.log)


def test_victim_freed_by_a_waiter_leaving_is_found() -> None:
    """After a victim search found nothing, a request that becomes preemptible
    without a slot changing hands (its inheritance ends) is found next time."""
    d = Driver(sched(2, aging_interval_s=None))
    d.submit(req("pinned", 3, 0.0, est_service_s=LONG, preemptible=False))
    d.submit(req("dep", 3, 0.0, est_service_s=LONG))
    assert sorted(ids(d.step())) == ["dep", "pinned"]
    d.submit(req("waiter", 0, 0.0, depends_on=("dep",)))
    assert d.step() == []  # dep runs at P0 rank now; pinned may not be preempted
    d.now = 1.0
    d.submit(req("urgent", 0, 1.0))
    assert d.step() == []  # nothing it may preempt: dep runs at P0 rank
    d.now = 2.0
    d.cancel("waiter")  # dep is an ordinary P3 again
    assert d.step() == [Preempt("dep", "w1", "checkpoint", 0)]


def test_preempted_dependency_resumes_at_the_inherited_rank() -> None:
    d = _busy(1)
    d.submit(req("dep", 3, 0.0, est_service_s=LONG))
    d.finish("busy0")
    assert ids(d.step()) == ["dep"]
    d.submit(req("p0", 0, 1.0, est_service_s=LONG))
    d.now = 1.0
    assert ids(d.step()) == ["dep"]  # preempted for the P0
    d.ack("dep")
    assert ids(d.step()) == ["p0"]
    d.submit(req("p1", 1, 1.5))
    d.submit(req("waiter", 0, 2.0, depends_on=("dep",)))
    d.now = 3.0
    d.finish("p0")
    assert d.step() == [Dispatch("dep", "w0", "checkpoint")]
