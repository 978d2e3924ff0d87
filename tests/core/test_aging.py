"""Aging raises dispatch rank only: order changes, rights and preemptibility do not."""

from __future__ import annotations

import pytest

from laneway.core import Dispatch, Preempt
from laneway.core.aging import aged_rank

from .helpers import Driver, ids, req, sched


@pytest.mark.parametrize(
    ("cls", "waited", "interval", "ceiling", "rank"),
    [
        (3, 0.0, 10.0, 1, 3),
        (3, 9.99, 10.0, 1, 3),
        (3, 10.0, 10.0, 1, 2),
        (3, 19.0, 10.0, 1, 2),
        (3, 25.0, 10.0, 1, 1),
        (3, 29.0, 10.0, 1, 1),
        (3, 1e6, 10.0, 1, 1),  # never above the ceiling
        (3, 1e6, 10.0, 2, 2),
        (3, 1e6, 10.0, 0, 0),
        (2, 1e6, 10.0, 2, 2),  # already at the ceiling: no change
        (1, 1e6, 10.0, 2, 1),  # above the ceiling: never lowered
        (0, 1e6, 10.0, 1, 0),
        (3, 1e6, None, 0, 3),  # aging disabled
    ],
)
def test_aged_rank(cls: int, waited: float, interval: float | None, ceiling: int, rank: int) -> None:
    assert aged_rank(cls, waited, interval, ceiling) == rank


def _blocked(policy: str = "laneway", **cfg: object) -> Driver:
    """One slot held by a non-preemptible P1 request ``blocker``."""
    d = Driver(sched(1, policy, **cfg))
    d.submit(req("blocker", 1, 0.0))
    assert ids(d.step()) == ["blocker"]
    return d


def test_aged_p3_goes_before_a_newer_p2() -> None:
    d = _blocked(aging_interval_s=10.0, aging_ceiling=1)
    d.submit(req("old-p3", 3, 0.0))
    d.now = 15.0
    d.submit(req("new-p2", 2, 15.0))
    d.step()
    d.finish("blocker")
    assert ids(d.step()) == ["old-p3"]


def test_unaged_p3_waits_for_the_p2() -> None:
    d = _blocked(aging_interval_s=10.0, aging_ceiling=1)
    d.submit(req("old-p3", 3, 0.0))
    d.now = 5.0
    d.submit(req("new-p2", 2, 5.0))
    d.now = 9.0
    d.finish("blocker")
    assert ids(d.step()) == ["new-p2"]


def test_no_aging_under_the_priority_policy() -> None:
    d = _blocked("priority", aging_interval_s=10.0, aging_ceiling=1)
    d.submit(req("old-p3", 3, 0.0))
    d.now = 500.0
    d.submit(req("new-p2", 2, 500.0))
    d.finish("blocker")
    assert ids(d.step()) == ["new-p2"]


@pytest.mark.parametrize(
    ("p2_at", "p3_at", "first"),
    [(0.0, 1.0, "p2"), (1.0, 0.0, "p2"), (9.0, 0.0, "p2"), (11.0, 0.0, "p3")],
)
def test_an_aged_request_counts_as_arriving_an_interval_later_per_class_it_rose(
    p2_at: float, p3_at: float, first: str
) -> None:
    """A P3 aged to P2 ranks with the P2 work that arrived up to one interval (10 s) after
    it: it waits at most that much longer than P2 work, but does not go ahead of all of it."""
    d = _blocked(aging_interval_s=10.0, aging_ceiling=2)
    d.submit(req("p2", 2, p2_at))
    d.submit(req("p3", 3, p3_at))
    d.now = 50.0  # the P3 has aged up to the ceiling (rank 2)
    d.finish("blocker")
    assert ids(d.step()) == [first]


@pytest.mark.parametrize(
    ("ceiling", "newer", "first"),
    [
        (2, 1, "new"),  # capped at rank 2: a P1 still goes first
        (1, 0, "new"),  # capped at rank 1: a P0 still goes first
        (2, 2, "old-p3"),  # rank 2 with the earlier arrival
        (1, 2, "old-p3"),
    ],
)
def test_ceiling(ceiling: int, newer: int, first: str) -> None:
    d = _blocked(aging_interval_s=10.0, aging_ceiling=ceiling)
    d.submit(req("old-p3", 3, 0.0))
    d.now = 1000.0
    d.submit(req("new", newer, 1000.0))
    d.finish("blocker")
    assert ids(d.step(), Dispatch) == [first]


def test_aged_p2_may_pass_a_newer_p1_under_ceiling_1() -> None:
    # a P1 may not preempt a P2, so aging the P2 up to rank 1 is safe
    d = _blocked(aging_interval_s=10.0, aging_ceiling=1)
    d.submit(req("old-p2", 2, 0.0))
    d.now = 200.0  # within the P2 queue timeout
    d.submit(req("new-p1", 1, 200.0))
    d.finish("blocker")
    assert d.step() == [Dispatch("old-p2", "w0", None)]


@pytest.mark.parametrize(("ceiling", "newer"), [(1, 1), (0, 0), (0, 1)])
def test_aging_stops_below_classes_that_may_preempt(ceiling: int, newer: int) -> None:
    """Aging a P3 past a waiting P0/P1 would dispatch it only to preempt it in
    the same step: the newer, more urgent request goes first instead."""
    d = _blocked(aging_interval_s=10.0, aging_ceiling=ceiling)
    d.submit(req("old-p3", 3, 0.0, est_service_s=100.0))
    d.now = 1000.0
    d.submit(req("new", newer, 1000.0))
    d.finish("blocker")
    out = d.step()
    assert not set(ids(out, Dispatch)) & set(ids(out, Preempt)), out
    assert out == [Dispatch("new", "w0", None)]


def test_aged_p3_gains_no_preemption_rights() -> None:
    # the slot is held by a *preemptible* P2; even aged to rank 0 the P3 waits for it
    d = Driver(sched(1, aging_interval_s=1.0, aging_ceiling=0))
    d.submit(req("p2", 2, 0.0, est_service_s=10_000.0))
    assert ids(d.step()) == ["p2"]
    d.submit(req("p3", 3, 0.0))
    out = d.advance(5_000.0)
    assert not any(type(x) is Preempt for _, x in d.log), out
    assert d.sched.get("p3").state.value == "queued"
    d.finish("p2")
    assert ids(d.step()) == ["p3"]


def test_aged_p3_can_itself_be_preempted() -> None:
    d = _blocked(aging_interval_s=10.0, aging_ceiling=0)
    d.submit(req("p3", 3, 0.0, est_service_s=10_000.0))
    d.now = 100.0
    d.submit(req("p2", 2, 100.0))
    d.finish("blocker")
    assert ids(d.step()) == ["p3"]  # aged to rank 0: ahead of the fresh P2
    d.now = 101.0
    d.submit(req("p0", 0, 101.0))
    out = d.step()
    assert [(type(x), x.request_id) for x in out] == [(Preempt, "p3")]
    d.ack("p3")
    assert ids(d.step(), Dispatch) == ["p0"]


def test_aging_counts_from_arrival_not_submission() -> None:
    d = _blocked(aging_interval_s=10.0, aging_ceiling=1)
    d.now = 20.0
    d.submit(req("p3", 3, 0.0))  # it arrived long ago (for example at a gateway)
    d.submit(req("p2", 2, 20.0))
    d.finish("blocker")
    assert ids(d.step()) == ["p3"]
