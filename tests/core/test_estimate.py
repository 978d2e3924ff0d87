"""Wait estimates: zero with a free slot, growing with the queue ahead, ~0 for P0
when it may preempt; the measurements behind them."""

from __future__ import annotations

import itertools
import math

import pytest

from laneway.core.measures import (
    SPREAD_AFTER,
    SPREAD_WINDOW,
    ArrivalRates,
    ServiceStats,
    SizeSpread,
)
from laneway.core.wait_formulas import first_end_median, start_after, wait_estimate

from .helpers import Driver, req, sched


def test_zero_with_a_free_slot() -> None:
    s = sched(2)
    for cls in range(4):
        assert s.estimate_wait(cls, None, 0.0) == 0.0
    d = Driver(s)
    d.submit(req("a", 2, 0.0, est_service_s=100.0))
    d.step()
    for cls in range(4):
        assert s.estimate_wait(cls, None, 0.0) == 0.0  # one slot is still free


def _busy(policy: str = "laneway", n_slots: int = 1, cls: int = 1, *, preemptible: bool = False) -> Driver:
    d = Driver(sched(n_slots, policy))
    for i in range(n_slots):
        d.submit(req(f"busy{i}", cls, 0.0, est_service_s=100.0, preemptible=preemptible))
    d.step()
    return d


@pytest.mark.parametrize("policy", ["fifo", "priority", "graceful", "mlfq", "laneway"])
def test_grows_with_the_queue_ahead(policy: str) -> None:
    d = _busy(policy)
    seen = [d.sched.estimate_wait(2, None, 0.0)]
    assert seen[0] > 0.0
    for i in range(5):
        d.submit(req(f"q{i}", 2, 0.0, est_service_s=10.0))
        seen.append(d.sched.estimate_wait(2, None, 0.0))
    assert all(b > a for a, b in itertools.pairwise(seen)), seen


def test_under_drain_only_preemption_p0_waits_for_the_victim_it_drains() -> None:
    """graceful drains the victim that ends soonest when it ends within the drain cap
    (30 s), and preempts past it: P0's estimate is that victim's end, or ~0 beyond the cap."""
    d = Driver(sched(2, "graceful"))
    d.submit(req("a", 2, 0.0, est_service_s=40.0))
    d.submit(req("b", 2, 0.0, est_service_s=50.0))
    d.step()
    assert d.sched.estimate_wait(0, None, 0.0, raw=True) == 0.0  # 40 s to go: preempted at once
    d.now = 25.0
    assert d.sched.estimate_wait(0, None, d.now, raw=True) == pytest.approx(15.0)  # a is drained
    d.submit(req("chat", 0, d.now))
    d.step()  # claims a, which it drains
    assert d.sched.get("a").claimed_for == 0
    assert d.sched.estimate_wait(0, None, d.now, raw=True) == pytest.approx(25.0)  # then b
    d.now = 26.0
    assert d.sched.estimate_wait(0, None, d.now, raw=True) == pytest.approx(24.0)
    laneway = _busy(n_slots=1, cls=2, preemptible=True)
    assert laneway.sched.estimate_wait(0, None, 0.0, raw=True) == 0.0  # (checkpoints instead)


def test_less_urgent_queues_are_not_ahead() -> None:
    d = _busy()
    before = {c: d.sched.estimate_wait(c, None, 0.0) for c in range(4)}
    for i in range(5):
        d.submit(req(f"p3-{i}", 3, 0.0, est_service_s=10.0))
    after = {c: d.sched.estimate_wait(c, None, 0.0) for c in range(4)}
    assert after[2] == pytest.approx(before[2])
    assert after[3] > before[3]


def test_fifo_sees_every_class_ahead() -> None:
    d = _busy("fifo")
    before = d.sched.estimate_wait(0, None, 0.0)
    for i in range(5):
        d.submit(req(f"p3-{i}", 3, 0.0, est_service_s=10.0))
    assert d.sched.estimate_wait(0, None, 0.0) > before


def test_p0_sees_about_zero_when_it_can_preempt() -> None:
    d = _busy(n_slots=2, cls=3, preemptible=True)
    assert d.sched.estimate_wait(0, None, 0.0) == pytest.approx(0.0, abs=1e-9)
    assert d.sched.estimate_wait(1, None, 0.0) == pytest.approx(0.0, abs=1e-9)  # P1 may preempt P3 too
    assert d.sched.estimate_wait(2, None, 0.0) > 1.0  # P2 may not
    d2 = _busy("priority", n_slots=2, cls=3, preemptible=True)  # no preemption under this policy
    assert d2.sched.estimate_wait(0, None, 0.0) > 1.0


def test_p0_waits_for_work_it_may_not_preempt() -> None:
    d = _busy(n_slots=2, cls=1)
    est = d.sched.estimate_wait(0, None, 0.0)
    assert est > 1.0 and est <= 100.0
    # the estimate shrinks as the blocking work gets closer to its end
    assert d.sched.estimate_wait(0, None, 60.0) < est


def test_work_marked_not_preemptible_is_waited_for_by_the_classes_that_could_preempt_it() -> None:
    """A P3 that may not be preempted (``preemptible: false``) holds its slot to its end: a
    P0 or P1 is told its end, not "a slot is free for it now" (it was admitted on that, then
    timed out in the queue)."""
    d = _busy(n_slots=1, cls=3)  # not preemptible, 100 s
    for cls in (0, 1):
        assert d.sched.estimate_wait(cls, None, 0.0, raw=True) == pytest.approx(100.0)
        assert d.sched.estimate_wait(cls, None, 60.0, raw=True) == pytest.approx(40.0)
    # beside a preemptible one, the slot it may take is that one's
    d2 = Driver(sched(2, "laneway"))
    d2.submit(req("fixed", 3, 0.0, est_service_s=100.0, preemptible=False))
    d2.submit(req("free", 3, 0.0, est_service_s=100.0, preemptible=True))
    d2.step()
    assert d2.sched.estimate_wait(0, None, 0.0, raw=True) == 0.0
    d3 = _busy(n_slots=2, cls=3)  # both not preemptible: the first to end
    assert d3.sched.estimate_wait(0, None, 0.0, raw=True) == pytest.approx(100.0)


def test_rejections_carry_the_estimate() -> None:
    d = _busy()
    d.submit(req("p0", 0, 0.0))
    d.now = 30.0
    (rej,) = d.step()
    assert rej.estimated_wait_s == pytest.approx(d.sched.estimate_wait(0, None, 30.0))  # type: ignore[union-attr]


# ---------------------------------------------------------------- the pure parts
def test_wait_estimate_function() -> None:
    base = {
        "slots": 4,
        "available": 0,
        "ahead": 0,
        "ahead_work_s": 0.0,
        "blocking": 4,
        "blocking_remaining_s": 40.0,
        "mean_service_s": 10.0,
        "urgent_load": 0.0,
    }
    assert math.isinf(wait_estimate(**{**base, "slots": 0}))  # type: ignore[arg-type]
    assert wait_estimate(**{**base, "available": 1}) == 0.0  # type: ignore[arg-type]
    first = wait_estimate(**base)  # type: ignore[arg-type]
    assert first == pytest.approx(2 * 10.0 * 1 / 5)  # first of 4 uniform remainders
    more = wait_estimate(**{**base, "ahead": 3, "ahead_work_s": 30.0})  # type: ignore[arg-type]
    assert more > first
    beyond = wait_estimate(**{**base, "ahead": 8, "ahead_work_s": 80.0})  # type: ignore[arg-type]
    assert beyond > more
    loaded = wait_estimate(**{**base, "urgent_load": 0.5})  # type: ignore[arg-type]
    assert loaded == pytest.approx(2 * first)
    capped = wait_estimate(**{**base, "urgent_load": 7.0})  # type: ignore[arg-type]
    assert capped == pytest.approx(first / 0.1)
    assert wait_estimate(**{**base, "urgent_load": -1.0}) == pytest.approx(first)  # type: ignore[arg-type]


def test_service_stats() -> None:
    st = ServiceStats(4, prior_s=10.0)
    assert st.mean(0) == 10.0 and st.mean(3, "m") == 10.0
    st.record(2, "m", 30.0)
    assert st.mean(2) == pytest.approx((30.0 + 10.0) / 2)  # one sample, one prior
    assert st.mean(0) == pytest.approx(30.0)  # unmeasured classes borrow the measured mean
    for _ in range(4):
        st.record(2, "m", 30.0)
    assert st.mean(2, "m") == pytest.approx(30.0)  # five samples: the model's own mean
    assert st.mean(2, "other") == st.mean(2)
    st.record(0, None, 2.0)
    assert st.mean(0) == pytest.approx(6.0)


def test_scheduler_measures_service_times() -> None:
    d = Driver(sched(1))
    d.submit(req("a", 2, 0.0))
    d.step()
    d.now = 50.0
    d.finish("a")
    assert d.sched.service.mean(2) == pytest.approx(30.0)
    d.submit(req("b", 2, 50.0))
    assert d.sched.get("b").est_s == pytest.approx(30.0)
    d.step()
    d.now = 60.0
    d.finish("b", failed=True)  # failures are not service-time samples
    assert d.sched.service.mean(2) == pytest.approx(30.0)


def test_arrival_rates() -> None:
    ar = ArrivalRates(2, bucket_s=100.0)
    assert ar.rate(0, 0.0) == 0.0
    ar.add(0, 50.0, 10.0)
    ar.add(0, 50.0, 20.0)
    assert ar.rate(0, 50.0) == pytest.approx(100.0 / 150.0)
    assert ar.rate(1, 50.0) == 0.0
    assert ar.rate(0, 150.0) == pytest.approx(100.0 / 150.0)  # the last complete bucket
    assert ar.rate(0, 1000.0) == 0.0  # long forgotten


def test_running_work_past_its_estimate_is_not_taken_to_end_at_once() -> None:
    """A short request sets the class mean; a long one then overruns it. A new
    request still waits for that long one: the estimate does not drop to 0."""
    d = Driver(sched(1))
    d.submit(req("short", 2, 0.0))
    d.step()
    d.now = 1.0
    d.finish("short")
    d.submit(req("long", 2, 1.0))
    d.step()
    long = d.sched.get("long")
    mean = long.est_s  # (it announced no size: its class's mean)
    expected_end = long.expected_end_s
    d.now = expected_end - 2.0  # before its expected end: it may end any time before 2 x mean
    ran = d.now - long.started_s
    assert d.sched.estimate_wait(2, None, d.now) == pytest.approx((2 * mean - ran) / 2, rel=0.05)
    d.now = expected_end + 20.0  # 20 s past its expected end, still running
    assert d.sched.estimate_wait(2, None, d.now) == pytest.approx(20.0, rel=0.3)  # about as much again


def test_the_first_end_among_requests_of_unknown_size_is_sooner_than_the_earliest_expected() -> None:
    assert first_end_median([(0.0, 10.0)]) == pytest.approx(5.0, abs=1e-3)
    # two alike: none ended by x with chance ((10 - x) / 10)^2 = 1/2
    assert first_end_median([(0.0, 10.0)] * 2) == pytest.approx(10 * (1 - 0.5**0.5), abs=1e-3)
    assert first_end_median([(3.0, 3.0), (0.0, 100.0)]) == pytest.approx(3.0, abs=1e-3)  # a sized one
    spans = [(0.0, 12.0 - i * 0.5) for i in range(16)]
    earliest_expected = min(hi / 2 for _, hi in spans)  # 2.25 s
    assert first_end_median(spans) < earliest_expected / 3


def test_the_spread_of_announced_sizes_is_measured_per_class_over_recent_requests() -> None:
    spread = SizeSpread(2)
    for i in range(SPREAD_AFTER - 1):
        spread.record(0, 0.5 + i / 100)
    assert spread.ranges[0] is None  # too few yet
    for i in range(SPREAD_AFTER - 1, 101):
        spread.record(0, 0.5 + i / 200)  # 0.5 ... 1.0
    lo, hi = spread.ranges[0]  # type: ignore[misc]
    assert 0.5 <= lo < 0.75 < hi <= 1.0 and spread.ranges[1] is None
    for ratio in (0.0, -1.0, math.inf, math.nan):
        spread.record(1, ratio)  # nothing to learn from
    assert spread.ranges[1] is None
    for _ in range(2 * SPREAD_WINDOW):
        spread.record(0, 2.0)  # only the recent ones count
    assert spread.ranges[0] == (2.0, 2.0)


def test_a_running_sized_request_may_end_anywhere_in_its_class_s_measured_spread() -> None:
    """P2 requests sized at 100 s ended after 50 to 100 s: the one running now, just started,
    frees its slot for a P1 (which may not preempt it) about 75 s from now, not 100."""
    d = Driver(sched(1))
    n = 2 * SPREAD_AFTER  # (its range is worked out at this count)
    for i in range(n):
        d.submit(req(f"done{i}", 2, d.now, est_service_s=100.0))
        d.step()
        d.now += 50.0 + 50.0 * i / (n - 1)
        d.finish(f"done{i}")
    assert d.sched.estimate_wait(1, None, d.now, raw=True) == 0.0
    d.submit(req("long", 2, d.now, est_service_s=100.0))
    d.step()
    assert d.sched.estimate_wait(1, None, d.now, raw=True) == pytest.approx(75.0, rel=0.05)
    lo, hi = d.sched.spread.ranges[2]  # type: ignore[misc]
    assert 0.5 <= lo < 0.6 and 0.9 < hi <= 1.0
    d.now += 90.0  # in the last part of its spread: it ends before (hi x 100 - 90) s
    assert d.sched.estimate_wait(1, None, d.now, raw=True) == pytest.approx((hi * 100 - 90) / 2, rel=0.05)
    d.now += 30.0  # past the spread: overdue, as much again as it overran its expected end
    assert d.sched.estimate_wait(1, None, d.now, raw=True) == pytest.approx(20.0, rel=0.05)


def test_progress_moves_a_running_request_s_expected_end_to_its_own_pace() -> None:
    """A request sized at 1,000 tokens that makes 100 a second is expected to end ~10 s after it
    started, whatever its size hint said; one without a size is left alone."""
    s = sched(2)
    d = Driver(s)
    d.submit(req("a", 2, est_service_s=100.0, output_tokens=1000))
    d.submit(req("b", 2, est_service_s=100.0))
    d.step()
    d.now = 2.0
    s.progress("a", 200, d.now)  # 100 tokens/s
    s.progress("b", 200, d.now)
    a, b = s.get("a"), s.get("b")
    assert math.isclose(a.expected_end_s, 10.0) and math.isclose(a.est_s, 10.0)
    assert math.isclose(b.expected_end_s, 100.0)
    s.progress("a", 1000, 6.0)  # faster than expected: due now
    assert math.isclose(s.get("a").expected_end_s, 6.0)
    s.progress("nobody", 5, 6.0)  # ended or unknown: nothing to do


def test_a_model_with_no_worker_up_has_no_finite_estimate() -> None:
    s = sched(1)
    assert s.estimate_wait(1, None, 0.0) == 0.0
    s.set_available("w0", False)
    assert s.estimate_wait(1, None, 0.0) == math.inf and not s.available_for(None)
    s.set_available("w0", True)
    assert s.estimate_wait(1, None, 0.0) == 0.0


def test_a_short_request_ahead_takes_a_slot_and_gives_it_back_before_the_long_ones_end() -> None:
    assert start_after(0, [1.7, 5.1, 6.9, 7.2], 1, 0.2) == pytest.approx(1.9)  # not the 2nd end, 5.1
    assert start_after(2, [], 3, 1.0) == pytest.approx(1.0)  # two free: the 3rd ahead takes one at 1 s
    assert start_after(0, [3.0], 0, 5.0) == pytest.approx(3.0)
    assert start_after(0, [], 2, 1.0) == math.inf  # no slot at all
    # in the scheduler: 4 slots held by long P3 work sized to end at 2, 5, 7 and 7.5 s;
    # a short P2 queued; a new P2 starts once the short one had the first slot to free
    s = sched(4)
    for i, size in enumerate((2.0, 5.0, 7.0, 7.5)):
        s.submit(req(f"long{i}", 3, 0.0, est_service_s=size), 0.0)
    s.schedule(0.0)
    s.submit(req("short", 2, 0.0, est_service_s=0.25), 0.0)
    assert s.estimate_wait(2, None, 0.0, raw=True) == pytest.approx(2.25, abs=0.01)


def test_the_wait_for_a_model_counts_only_the_workers_that_serve_it() -> None:
    """Several models on fixed slots: a request of model b waits for b's one busy slot
    even while a's workers are free, and the queue of model a is not ahead of it."""
    from laneway.core import Dispatch, Scheduler, WorkerSpec

    s = Scheduler(
        [WorkerSpec("a0", 4, models=frozenset({"a"})), WorkerSpec("b0", 1, models=frozenset({"b"}))]
    )
    assert s.submit(req("long-b", 1, model="b", est_service_s=6.0, preemptible=False), 0.0) is None
    assert [d.worker_id for d in s.schedule(0.0) if isinstance(d, Dispatch)] == ["b0"]
    b = s.estimate_wait(2, "b", 0.5, raw=True)
    assert 5.0 <= b <= 6.0, b  # (it waits for the long one's end: a's free slots are not b's)
    assert s.estimate_wait(2, "a", 0.5, raw=True) == 0.0
    for i in range(8):  # a's queue: ahead of a's requests, not of b's
        assert s.submit(req(f"a{i}", 1, model="a", est_service_s=30.0, preemptible=False), 0.5) is None
    s.schedule(0.5)
    assert s.estimate_wait(2, "a", 0.6, raw=True) > 20.0
    assert 5.0 <= s.estimate_wait(2, "b", 0.6, raw=True) <= 6.0
