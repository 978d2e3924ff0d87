"""Workers that fail: requeueing their request, taking them out of placement, measured checkpoint costs."""

from __future__ import annotations

import math

import pytest

from laneway.core import (
    CostModel,
    Dispatch,
    InvalidTransition,
    LanewayError,
    Preempt,
    Reject,
    Scheduler,
    WorkerSpec,
)

from .gpu_helpers import gpu, gpu_sched, inventory, model
from .helpers import ids, req, sched


def test_requeue_puts_a_failed_start_back_at_the_head_of_its_class() -> None:
    s = sched(1)
    s.submit(req("a", 2, 0.0), 0.0)
    s.submit(req("b", 2, 1.0), 1.0)
    assert ids(s.schedule(1.0)) == ["a"]
    s.requeue("a", 2.0)
    s.check_invariants()
    out = s.schedule(2.0)
    assert out == [Dispatch("a", "w0", None)]  # first again (its arrival is kept), started afresh
    assert s.get("a").preemptions == 0 and s.counters.preemptions[2] == 0
    s.finished("a", 3.0)
    assert ids(s.schedule(3.0)) == ["b"]
    with pytest.raises(LanewayError):
        s.requeue("a", 3.0)  # it ended
    s.submit(req("c", 2, 4.0), 4.0)
    with pytest.raises(InvalidTransition):
        s.requeue("c", 4.0)  # queued, not running


def test_a_requeued_request_waits_its_queue_timeout_anew_and_only_while_it_waits() -> None:
    """Its worker failed before it produced anything: queued again, it may wait its class's
    timeout (60 s for P1) from then — not for ever, as a preempted request may."""
    s = sched(1)
    s.submit(req("a", 1, 0.0), 0.0)
    assert ids(s.schedule(0.0)) == ["a"]
    s.requeue("a", 50.0, failed=True)  # (after 50 s: its timeout counted from now)
    s.set_available("w0", False)  # (no worker to run it again)
    s.check_invariants()
    assert s.schedule(109.0) == [] and s.next_wakeup() == pytest.approx(110.0)
    out = s.schedule(110.0)
    assert [(type(d), d.reason) for d in out] == [(Reject, "queue_timeout")]  # type: ignore[union-attr]
    assert "a" not in s
    s.check_invariants()


def test_a_requeued_request_that_runs_again_is_never_expired_and_a_second_failure_counts_anew() -> None:
    s = sched(1)
    s.submit(req("a", 2, 0.0), 0.0)  # (P2: 300 s)
    s.schedule(0.0)
    s.requeue("a", 10.0, failed=True)  # (its deadline: 310 s)
    assert ids(s.schedule(10.0)) == ["a"]
    s.requeue("a", 100.0, failed=True)  # (failed again: 400 s)
    s.set_available("w0", False)
    assert s.schedule(310.0) == []  # (not by the first failure's deadline)
    s.set_available("w0", True)
    assert ids(s.schedule(320.0)) == ["a"]
    s.submit(req("chat", 0, 321.0), 321.0)
    out = s.schedule(321.0)
    assert ids(out, Preempt) == ["a"]  # (preempted by laneway: it waits as long as it takes)
    s.preempted("a", 322.0)
    assert ids(s.schedule(322.0)) == ["chat"]
    assert s.schedule(10_000.0) == [] and s.get("a").state.value == "queued"
    s.finished("chat", 10_001.0)
    assert ids(s.schedule(10_001.0)) == ["a"]


def test_a_requeued_request_with_no_timeout_waits_as_long_as_it_takes() -> None:
    s = sched(1)
    s.submit(req("a", 1, 0.0, timeout_s=math.inf), 0.0)
    s.schedule(0.0)
    s.requeue("a", 1.0, failed=True)
    s.set_available("w0", False)
    assert s.schedule(10_000.0) == [] and s.next_wakeup() == math.inf and "a" in s


def test_a_request_laneway_took_back_itself_waits_as_long_as_it_takes() -> None:
    """Queued again by laneway's own choice (the saturation gate taking back what an engine
    queued): as a preempted request, never expired."""
    s = sched(1)
    s.submit(req("a", 1, 0.0), 0.0)
    s.schedule(0.0)
    s.requeue("a", 1.0)
    s.set_available("w0", False)
    assert s.schedule(10_000.0) == [] and "a" in s


def test_requeue_while_being_preempted_undoes_the_preemption() -> None:
    s = sched(1)
    s.submit(req("batch", 3, 0.0), 0.0)
    s.schedule(0.0)
    s.submit(req("chat", 0, 1.0), 1.0)
    out = s.schedule(1.0)
    assert [type(d) for d in out] == [Preempt]
    s.requeue("batch", 1.5)  # its worker failed before it could stop it
    s.check_invariants()
    assert s.counters.preemptions[3] == 0
    assert ids(s.schedule(1.5)) == ["chat"]


def test_an_unavailable_worker_gets_nothing_until_it_recovers() -> None:
    s = sched(2)
    s.set_available("w0", False)
    for i in range(3):
        s.submit(req(f"r{i}", 1, float(i)), float(i))
    assert s.schedule(3.0) == [Dispatch("r0", "w1", None)]
    s.finished("r0", 4.0)
    assert s.schedule(4.0) == [Dispatch("r1", "w1", None)]
    s.set_available("w0", True)
    assert s.schedule(5.0) == [Dispatch("r2", "w0", None)]
    s.check_invariants()
    with pytest.raises(LanewayError, match="unknown worker"):
        s.set_available("w9", False)


def test_measured_checkpoints_teach_the_cost_model() -> None:
    costs = CostModel(kv_bytes_per_token=1000, host_link_bytes_s=1e8)
    s = sched(1, costs=costs)
    s.submit(req("batch", 3, 0.0, prompt_tokens=100), 0.0)
    s.schedule(0.0)
    s.submit(req("chat", 0, 1.0), 1.0)
    [p] = s.schedule(1.0)
    assert isinstance(p, Preempt) and p.mode == "checkpoint"
    # the worker measured 100 prompt + 20 generated tokens at 16 KB each, saved in 2 ms
    s.preempted("batch", 1.1, tokens_done=20, checkpoint_bytes=120 * 16_000, save_s=0.002)
    learned = s.costs
    assert 1000 < learned.kv_bytes_per_token < 16_000
    assert learned.host_link_bytes_s > 1e8
    assert s.cfg.costs is costs  # the configuration itself is unchanged
    for _ in range(30):
        learned = learned.observed(120 * 16_000, 120, 0.002)
    assert learned.kv_bytes_per_token == pytest.approx(16_000, rel=1e-3)
    assert learned.host_link_bytes_s == pytest.approx(120 * 16_000 / 0.002, rel=1e-3)
    assert learned.observed(0, 10, 0.1) is learned  # nothing measured: nothing learned


def test_an_unavailable_replica_takes_no_work() -> None:
    inv = inventory([gpu("g0", 80), gpu("g1", 80)], [model("m", 30, slots=1)], preload=("m", "m"))
    s = gpu_sched(inv)
    [first, second] = list(s.placement.replicas)  # type: ignore[attr-defined]
    s.set_available(first, False)
    s.submit(req("a", 1, 0.0, model="m"), 0.0)
    s.submit(req("b", 1, 0.0, model="m"), 0.0)
    out = [d for d in s.schedule(0.0) if isinstance(d, Dispatch)]
    assert [(d.request_id, d.worker_id) for d in out] == [("a", second)]
    s.set_available(first, True)
    out = [d for d in s.schedule(1.0) if isinstance(d, Dispatch)]
    assert [(d.request_id, d.worker_id) for d in out] == [("b", first)]
    s.check_invariants()


def test_adopt_takes_in_running_requests_that_then_end_or_are_preempted_as_any() -> None:
    s = sched(2)  # two workers of one slot
    s.adopt(req("old-batch", 3, 0.0), "w0", 5.0)
    s.adopt(req("old-chat", 1, 0.0), "w1", 5.0)
    s.check_invariants()
    assert s.free_slots == 0 and s.get("old-batch").worker == "w0"
    with pytest.raises(LanewayError):
        s.adopt(req("more", 3, 0.0), "w0", 5.0)  # no free slot there
    with pytest.raises(LanewayError):
        s.adopt(req("x", 3, 0.0), "nope", 5.0)
    s.submit(req("new", 3, 6.0), 6.0)
    assert s.schedule(6.0) == []  # every slot is held by the adopted
    s.submit(req("urgent", 0, 7.0), 7.0)
    out = s.schedule(7.0)
    assert [(type(d), d.request_id, d.worker_id) for d in out] == [(Preempt, "old-batch", "w0")]
    s.preempted("old-batch", 7.5, tokens_done=3, checkpoint_bytes=0)  # an adopted P3 is preempted like any
    assert [(d.request_id, d.worker_id) for d in s.schedule(7.5)] == [("urgent", "w0")]
    s.finished("old-chat", 8.0)
    assert ids(s.schedule(8.0)) == ["old-batch"]  # (it waited longer than "new")
    s.check_invariants()


def test_held_slots_are_neither_free_nor_running_and_come_back_when_let_go() -> None:
    s = Scheduler([WorkerSpec("w0", 2), WorkerSpec("w1", 2)])
    s.hold("w0", 2)
    s.hold("w1", 1)
    s.check_invariants()
    assert s.free_slots == 1
    for i in range(3):
        s.submit(req(f"r{i}", 2, float(i)), float(i))
    assert [(d.request_id, d.worker_id) for d in s.schedule(3.0)] == [("r0", "w1")]
    with pytest.raises(LanewayError):
        s.hold("w1", 2)  # its other slot runs r0: holding takes free slots only
    with pytest.raises(LanewayError):
        s.hold("nope", 1)
    with pytest.raises(LanewayError):
        s.hold("w0", -1)
    s.hold("w0", 1)  # one given back: the next in line starts there
    assert [(d.request_id, d.worker_id) for d in s.schedule(4.0)] == [("r1", "w0")]
    s.hold("w0", 0)
    s.hold("w1", 0)
    assert ids(s.schedule(5.0)) == ["r2"]
    s.check_invariants()
    assert s.free_slots == 1 and s.snapshot().slots_free == 1
