"""Preemption: victim choice, modes, caps, and how preempted work comes back."""

from __future__ import annotations

import math

import pytest

from laneway.core import CostModel, Dispatch, Preempt, Scheduler, SchedulerConfig, WorkerSpec
from laneway.core.victims import Action, Candidate, choose_action, choose_victim, soonest

from .helpers import Driver, ids, req, sched, slots


def cand(
    rid: str,
    cls: int = 3,
    *,
    seq: int = 0,
    eta: float = 100.0,
    ckpt: float = 1.0,
    recompute: float = 2.0,
    can: bool = True,
) -> Candidate:
    return Candidate(rid, "w0", cls, seq, eta, ckpt, recompute, can)


# ---------------------------------------------------------------- pure functions
def test_choose_victim_empty() -> None:
    assert choose_victim([]) is None
    assert soonest([]) is None
    for mode in ("drain", "auto", "checkpoint", "recompute"):
        assert choose_action([], mode, 30.0) is None


def test_choose_victim_lowest_class_first() -> None:
    cheap_p2 = cand("p2", 2, ckpt=0.1)
    dear_p3 = cand("p3", 3, ckpt=50.0, recompute=60.0)
    assert choose_victim([cheap_p2, dear_p3]) is dear_p3
    assert choose_victim([dear_p3, cheap_p2]) is dear_p3


def test_choose_victim_then_least_work_lost() -> None:
    a = cand("a", seq=1, ckpt=3.0, recompute=4.0)
    b = cand("b", seq=2, ckpt=5.0, recompute=1.0)  # recompute is its cheapest way: 1 s
    c = cand("c", seq=3, ckpt=2.0, recompute=9.0)
    assert b.best_mode == "recompute" and b.lost_s == 1.0
    assert choose_victim([a, b, c]) is b
    assert choose_victim([a, c]) is c


def test_choose_victim_tie_goes_to_the_latest_arrival() -> None:
    old, new = cand("old", seq=1), cand("new", seq=9)
    assert choose_victim([old, new]) is new
    assert choose_victim([new, old]) is new


def test_best_mode_and_lost() -> None:
    assert cand("a", ckpt=1.0, recompute=2.0).best_mode == "checkpoint"
    assert cand("a", ckpt=1.0, recompute=1.0).best_mode == "checkpoint"
    assert cand("a", ckpt=3.0, recompute=2.0).best_mode == "recompute"
    no = cand("a", ckpt=1.0, recompute=2.0, can=False)
    assert no.best_mode == "recompute"
    assert no.lost_s == 2.0


def test_drain_mode_waits_for_the_soonest_under_the_cap() -> None:
    victim = cand("victim", 3, eta=500.0, ckpt=0.1)
    quick = cand("quick", 2, eta=10.0, ckpt=9.0)
    assert soonest([victim, quick]) is quick
    assert choose_action([victim, quick], "drain", 30.0) == Action("drain", quick, "drain")
    assert choose_action([victim, quick], "drain", 10.0) == Action("drain", quick, "drain")
    assert choose_action([victim, quick], "drain", 9.9) == Action("preempt", victim, "checkpoint")
    slow = cand("slow", 3, eta=31.0, ckpt=5.0, recompute=1.0)
    assert choose_action([slow], "drain", 30.0) == Action("preempt", slow, "recompute")


def test_auto_mode_drains_when_waiting_is_cheaper_than_preempting() -> None:
    victim = cand("v", 3, eta=100.0, ckpt=0.5, recompute=0.8)
    assert choose_action([victim], "auto", 30.0) == Action("preempt", victim, "checkpoint")
    ending = cand("e", 3, eta=0.4, ckpt=0.5, recompute=0.8)
    assert choose_action([ending], "auto", 30.0) == Action("drain", ending, "drain")
    # the drain cap plays no part in auto mode
    assert choose_action([victim], "auto", 1e9).kind == "preempt"  # type: ignore[union-attr]
    # drain compares the soonest against what preempting the chosen victim costs
    other = cand("o", 2, eta=0.6, ckpt=9.0, recompute=9.0)
    assert choose_action([victim, other], "auto", 30.0) == Action("preempt", victim, "checkpoint")
    other = cand("o", 2, eta=0.4, ckpt=9.0, recompute=9.0)
    assert choose_action([victim, other], "auto", 30.0) == Action("drain", other, "drain")


def test_auto_mode_recomputes_where_checkpoints_are_impossible() -> None:
    v = cand("v", 3, eta=100.0, ckpt=0.1, recompute=0.8, can=False)
    assert choose_action([v], "auto", 30.0) == Action("preempt", v, "recompute")


def test_fixed_modes() -> None:
    v = cand("v", 3, eta=0.01, ckpt=5.0, recompute=1.0)
    assert choose_action([v], "checkpoint", 30.0) == Action("preempt", v, "checkpoint")
    assert choose_action([v], "recompute", 30.0) == Action("preempt", v, "recompute")
    no = cand("n", 3, can=False)
    assert choose_action([no], "checkpoint", 30.0) == Action("preempt", no, "recompute")
    with pytest.raises(ValueError, match="mode"):
        choose_action([v], "teleport", 30.0)


# ---------------------------------------------------------------- in the scheduler
def _full(
    n: int,
    specs: list[tuple[str, int, dict[str, object]]],
    policy: str = "laneway",
    *,
    at: float = 1.0,
    **cfg: object,
) -> Driver:
    """``n`` slots filled at 0 by the given running requests (id, class, extra
    fields); the clock is left at ``at``."""
    d = Driver(sched(n, policy, **cfg))
    for rid, cls, kw in specs:
        d.submit(req(rid, cls, 0.0, **kw))
    assert sorted(ids(d.step())) == sorted(rid for rid, _, _ in specs)
    d.now = at
    return d


LONG: dict[str, object] = {"est_service_s": 1000.0}


def test_p0_preempts_the_lowest_class_first() -> None:
    d = _full(2, [("p3", 3, {**LONG, "prompt_tokens": 50_000}), ("p2", 2, {**LONG, "prompt_tokens": 10})])
    d.submit(req("p0", 0, 1.0))
    out = d.step()
    assert out == [Preempt("p3", d.running["p3"], "checkpoint", 0)]


@pytest.mark.parametrize("order", [("big", "small"), ("small", "big")])
def test_p0_preempts_the_least_work_lost_within_a_class(order: tuple[str, str]) -> None:
    prompts = {"big": 50_000, "small": 100}
    d = _full(2, [(rid, 3, {**LONG, "prompt_tokens": prompts[rid]}) for rid in order])
    d.submit(req("p0", 0, 1.0))
    assert ids(d.step(), Preempt) == ["small"]


def test_p1_preempts_p3_only() -> None:
    d = _full(1, [("p2", 2, LONG)])
    d.submit(req("p1", 1, 1.0))
    assert d.step() == []
    d2 = _full(1, [("p3", 3, LONG)])
    d2.submit(req("p1", 1, 1.0))
    assert d2.step() == [Preempt("p3", "w0", "checkpoint", 1)]


@pytest.mark.parametrize("running", [0, 1])
def test_p0_and_p1_are_never_preempted(running: int) -> None:
    d = _full(1, [("busy", running, LONG)])
    d.submit(req("p0", 0, 1.0))
    d.submit(req("p1", 1, 1.0))
    assert d.advance(25.0) == []  # short of the P0 timeout
    assert d.sched.get("p0").state.value == "queued"


def test_p2_and_p3_have_no_preemption_rights() -> None:
    d = _full(1, [("p3", 3, LONG)])
    d.submit(req("p2", 2, 1.0))
    d.submit(req("p3b", 3, 1.0))
    assert d.advance(100.0) == []


def test_preemptible_false_is_honoured() -> None:
    d = _full(2, [("pinned", 3, {**LONG, "preemptible": False}), ("free", 2, LONG)])
    d.submit(req("p0", 0, 1.0))
    assert ids(d.step(), Preempt) == ["free"]
    d.submit(req("p0b", 0, 1.0))
    assert d.step() == []  # only the pinned one is left: the second P0 waits


def test_several_waiting_p0_preempt_several_victims_at_once() -> None:
    d = _full(3, [("a", 3, LONG), ("b", 3, LONG), ("c", 2, LONG)])
    d.submit(req("x", 0, 1.0))
    d.submit(req("y", 0, 1.0))
    assert sorted(ids(d.step(), Preempt)) == ["a", "b"]
    # acknowledged one by one, each freed slot goes to a waiting P0, in order
    d.ack("b")
    assert ids(d.step()) == ["x"]
    d.ack("a")
    assert ids(d.step()) == ["y"]


def test_max_preemptions_cap() -> None:
    d = _full(1, [("p3", 3, LONG)], max_preemptions=2)
    for i in range(2):
        d.submit(req(f"p0-{i}", 0, d.now))
        assert ids(d.step()) == ["p3"]
        d.ack("p3")
        assert ids(d.step()) == [f"p0-{i}"]
        d.now += 1.0
        d.finish(f"p0-{i}")
        assert d.step() == [Dispatch("p3", "w0", "checkpoint")]
        d.now += 1.0
    assert d.sched.get("p3").preemptions == 2
    d.submit(req("p0-late", 0, d.now))
    assert d.advance(29.0) == []  # the P3 has been preempted enough: it runs to the end
    d.finish("p3")
    assert ids(d.step()) == ["p0-late"]


def test_a_request_preempted_many_times_is_preempted_again_while_it_lost_little() -> None:
    """No count cap by default: with checkpoints a preemption costs a fraction of a
    second, so the tenth P0 preempts the batch job as the first did (a cap of 3 made
    P0 wait once every running batch job had used it)."""
    d = _full(1, [("p2", 2, LONG)])
    for i in range(10):
        d.submit(req(f"p0-{i}", 0, d.now))
        assert ids(d.step()) == ["p2"], i
        d.ack("p2")
        assert ids(d.step()) == [f"p0-{i}"]
        d.now += 1.0
        d.finish(f"p0-{i}")
        assert d.step() == [Dispatch("p2", "w0", "checkpoint")]
        d.now += 1.0
    r = d.sched.get("p2")
    assert r.preemptions == 10 and 0 < r.lost_s < 0.25 * 1000.0


def test_a_request_that_lost_its_share_to_preemptions_runs_to_the_end() -> None:
    """``max_preempt_loss``: past that share of its service lost to preemptions (here
    recomputing a long context each time), a victim is not preempted again; an urgent
    request takes another victim, or waits for it."""
    big = {"est_service_s": 20.0, "prompt_tokens": 40_000}  # a recompute: 5 s of prefill
    config = SchedulerConfig(max_preempt_loss=0.25)
    d = Driver(Scheduler(slots(2, can_checkpoint=False), config, "laneway"))
    d.submit(req("a", 2, 0.0, **big))
    d.submit(req("b", 2, 0.0, **{**big, "prompt_tokens": 80_000}))
    assert sorted(ids(d.step())) == ["a", "b"]
    d.now = 1.0
    d.submit(req("u1", 0, d.now))
    assert ids(d.step()) == ["a"]  # the cheaper one to recompute
    d.ack("a")
    assert ids(d.step()) == ["u1"]
    d.now += 1.0
    d.finish("u1")
    assert d.step() == [Dispatch("a", d.running["a"], "recompute")]
    assert d.sched.get("a").lost_s == pytest.approx(5.0 + d.sched.costs.step_s, rel=0.05)  # 25 % of 20 s
    d.now += 1.0
    d.submit(req("u2", 0, d.now))
    assert ids(d.step()) == ["b"]  # "a" lost its share: the other one, dearer now, goes
    d.ack("b")
    assert ids(d.step()) == ["u2"]


def test_a_count_cap_can_still_be_set() -> None:
    d = _full(1, [("p3", 3, LONG)], max_preemptions=1)
    d.submit(req("p0-0", 0, d.now))
    assert ids(d.step()) == ["p3"]
    d.ack("p3")
    assert ids(d.step()) == ["p0-0"]
    d.finish("p0-0")
    assert ids(d.step()) == ["p3"]
    d.submit(req("p0-1", 0, d.now))
    assert d.step() == []


def test_max_preemptions_zero_disables_preemption() -> None:
    d = _full(1, [("p3", 3, LONG)], max_preemptions=0)
    d.submit(req("p0", 0, 1.0))
    assert d.step() == []


def test_preempted_request_goes_back_to_the_head_of_its_class() -> None:
    d = _full(1, [("first", 3, LONG)], aging_interval_s=None)
    d.submit(req("second", 3, 0.5))
    d.submit(req("third", 3, 0.7))
    d.submit(req("p0", 0, 1.0))
    assert d.step() == [Preempt("first", "w0", "checkpoint", 0)]
    d.now = 1.1
    d.ack("first")
    assert ids(d.step()) == ["p0"]
    r = d.sched.get("first")
    assert r.arrival_s == 0.0
    assert r.state.value == "queued"
    assert r.preemptions == 1
    d.now = 5.0
    d.finish("p0")
    assert d.step() == [Dispatch("first", "w0", "checkpoint")]
    assert r.first_start_s == 0.0 and r.started_s == 5.0
    assert r.run_s == pytest.approx(1.0)  # it ran from 0 to its preemption at 1
    d.finish("first")
    assert ids(d.step()) == ["second"]


def test_resume_uses_the_mode_of_the_preemption() -> None:
    d = Driver(Scheduler([WorkerSpec("w0", 1, can_checkpoint=False)]))
    d.submit(req("p3", 3, 0.0, **LONG))
    d.step()
    d.submit(req("p0", 0, 1.0))
    d.now = 1.0
    assert d.step() == [Preempt("p3", "w0", "recompute", 0)]
    d.ack("p3")
    d.step()
    d.finish("p0")
    assert d.step() == [Dispatch("p3", "w0", "recompute")]


def test_auto_picks_recompute_when_it_is_cheaper() -> None:
    slow_link = CostModel(host_link_bytes_s=1e8)
    d = _full(1, [("p3", 3, LONG)], costs=slow_link)
    d.submit(req("p0", 0, 1.0))
    assert d.step() == [Preempt("p3", "w0", "recompute", 0)]


def test_checkpoint_accounting_after_preemption() -> None:
    d = _full(1, [("p3", 3, {**LONG, "prompt_tokens": 1000})])
    d.now = 11.0
    d.submit(req("p0", 0, 11.0))
    d.step()
    d.sched.preempted("p3", 11.0, tokens_done=123, checkpoint_bytes=4567)
    del d.running["p3"]
    d.resume_mode["p3"] = d.stopping.pop("p3")
    r = d.sched.get("p3")
    assert (r.tokens_done, r.checkpoint_bytes) == (123, 4567)
    # without figures from the worker, the cost model fills them in
    d2 = _full(1, [("p3", 3, {**LONG, "prompt_tokens": 1000})])
    d2.now = 11.0
    d2.submit(req("p0", 0, 11.0))
    d2.step()
    d2.ack("p3")
    r2 = d2.sched.get("p3")
    costs = d2.sched.cfg.costs
    assert r2.tokens_done == costs.generated_in(11.0)
    assert r2.checkpoint_bytes == costs.checkpoint_bytes(1000 + r2.tokens_done)


# ---------------------------------------------------------------- laneway: drain or preempt
QUICK: dict[str, object] = {"est_service_s": 0.2}  # at 0.15 s, ~0.05 s left


def test_laneway_drains_a_victim_about_to_finish() -> None:
    d = _full(1, [("quick", 3, QUICK)], at=0.15)
    d.submit(req("p0", 0, 0.15))  # less time left than a checkpoint round trip (~0.067 s)
    assert d.step() == []
    r = d.sched.get("quick")
    assert r.claimed_for == 0
    assert d.sched.counters.drains == 1
    wake = d.sched.next_wakeup()
    assert 0.15 < wake < 0.3
    d.now = 0.2
    d.finish("quick")
    assert d.step() == [Dispatch("p0", "w0", None)]
    assert not any(type(x) is Preempt for _, x in d.log)


def test_laneway_drain_claim_becomes_a_preemption_at_its_deadline() -> None:
    d = _full(1, [("quick", 3, QUICK)], at=0.15)
    d.submit(req("p0", 0, 0.15))
    assert d.step() == []
    wake = d.sched.next_wakeup()
    assert 0.15 < wake < 0.3
    d.now = wake - 1e-6
    assert d.step() == []
    d.now = wake
    out = d.step()  # it did not end in time: stop it
    assert [type(x) for x in out] == [Preempt] and out[0].request_id == "quick"  # type: ignore[union-attr]
    assert out[0].for_class == 0  # type: ignore[union-attr]
    d.ack("quick")
    assert ids(d.step()) == ["p0"]


def test_laneway_checkpoints_a_long_victim() -> None:
    d = _full(1, [("long", 3, LONG)])
    d.submit(req("p0", 0, 1.0))
    assert d.step() == [Preempt("long", "w0", "checkpoint", 0)]


def test_laneway_recomputes_where_the_worker_cannot_checkpoint() -> None:
    d = Driver(Scheduler(slots(1, can_checkpoint=False)))
    d.submit(req("long", 3, 0.0, **LONG))
    d.step()
    d.submit(req("p0", 0, 1.0))
    d.now = 1.0
    assert d.step() == [Preempt("long", "w0", "recompute", 0)]


# ---------------------------------------------------------------- graceful
def test_graceful_drains_under_the_cap_then_preempts_at_the_deadline() -> None:
    d = _full(1, [("p3", 3, {"est_service_s": 20.0})], "graceful", drain_cap_s=30.0)
    d.submit(req("p0", 0, 1.0, timeout_s=100.0))
    assert d.step() == []  # about 19 s left: under the 30 s cap, so wait
    assert d.sched.next_wakeup() == pytest.approx(31.0)
    assert d.advance(29.9) == []
    out = d.advance(0.2)  # the victim overran its estimate: the drain turns into a preemption
    assert out == [Preempt("p3", "w0", "checkpoint", 0)]
    d.ack("p3")
    assert ids(d.step()) == ["p0"]
    assert math.isinf(d.sched.next_wakeup()) or d.sched.next_wakeup() > d.now


def test_graceful_drain_deadline_comes_before_the_waiting_request_expires() -> None:
    d = _full(1, [("p3", 3, {"est_service_s": 20.0})], "graceful")
    d.submit(req("p0", 0, 1.0))  # default P0 timeout 30 s = default drain cap
    assert d.step() == []
    wake = d.sched.next_wakeup()
    assert wake < 31.0  # the claim ends before the P0 would expire
    d.now = wake
    out = d.step()
    assert out == [Preempt("p3", "w0", "checkpoint", 0)]
    d.now += d.sched.cfg.costs.save_s(600)  # the worker saves the checkpoint
    d.ack("p3")
    assert d.step() == [Dispatch("p0", "w0", None)]
    assert d.now < 31.0


def test_graceful_drain_ends_when_the_victim_finishes() -> None:
    d = _full(1, [("p3", 3, {"est_service_s": 20.0})], "graceful")
    d.submit(req("p0", 0, 1.0))
    assert d.step() == []
    d.now = 18.0
    d.finish("p3")
    assert d.step() == [Dispatch("p0", "w0", None)]
    assert d.advance(100.0) == []
    assert not any(type(x) is Preempt for _, x in d.log)


def test_graceful_preempts_at_once_when_every_victim_ends_past_the_cap() -> None:
    d = _full(1, [("p3", 3, {"est_service_s": 100.0})], "graceful", drain_cap_s=30.0)
    d.submit(req("p0", 0, 1.0))
    assert d.step() == [Preempt("p3", "w0", "checkpoint", 0)]


def test_graceful_drains_the_soonest_victim() -> None:
    d = _full(2, [("slow", 3, {"est_service_s": 25.0}), ("soon", 2, {"est_service_s": 6.0})], "graceful")
    d.submit(req("p0", 0, 1.0))
    assert d.step() == []
    assert d.sched.get("soon").claimed_for == 0
    assert d.sched.get("slow").claimed_for is None
    d.now = 6.0
    d.finish("soon")
    assert ids(d.step()) == ["p0"]


@pytest.mark.parametrize("policy", ["fifo", "priority"])
def test_policies_without_preemption(policy: str) -> None:
    d = _full(1, [("p3", 3, LONG)], policy)
    d.submit(req("p0", 0, 1.0))
    d.advance(1000.0)
    assert not any(type(x) is Preempt for _, x in d.log)
    assert d.running == {"p3": "w0"}


# ---------------------------------------------------------------- claims and reserved slots
def test_slot_claimed_by_p1_goes_to_a_p0_that_arrived_meanwhile() -> None:
    """A slot freed for a P1 claim goes to a P0 that arrived meanwhile (else the
    P0 would wait for the whole P1 run); the P1 claims another victim."""
    d = _full(1, [("p3", 3, LONG)])
    d.submit(req("p1", 1, 1.0))
    assert d.step() == [Preempt("p3", "w0", "checkpoint", 1)]
    d.now = 1.01
    d.submit(req("p0", 0, 1.01))
    assert d.step() == []
    d.now = 1.1
    d.ack("p3")
    assert ids(d.step(), Dispatch) == ["p0"]
    assert d.sched.get("p1").state.value == "queued"


def test_stale_drain_claim_does_not_preempt_when_nobody_waits() -> None:
    """A drain claim whose class found another slot lapses at its deadline."""
    d = _full(2, [("quick", 3, QUICK), ("other", 2, {**LONG, "preemptible": False})], at=0.15)
    d.submit(req("p0", 0, 0.15))
    assert d.step() == []  # drain: quick is about to end
    d.now = 0.16
    d.finish("other")
    assert ids(d.step()) == ["p0"]  # the P0 found another slot
    assert d.advance(5.0) == []  # so nothing may be preempted for it any more
    assert not any(type(x) is Preempt for _, x in d.log)


def test_least_work_lost_among_many_running() -> None:
    """The cheapest victim is found wherever it sits in start order. (Fails
    while ``gather_candidates`` looks only at the two started first and the two
    started last of each class: here it picks r4, which holds 50,000 tokens.)"""
    prompts = [50_000, 50_000, 10, 50_000, 50_000]
    d = _full(5, [(f"r{i}", 3, {**LONG, "prompt_tokens": p}) for i, p in enumerate(prompts)])
    d.submit(req("p0", 0, 1.0))
    assert ids(d.step(), Preempt) == ["r2"]


def test_victim_released_by_a_lapsed_drain_claim_is_found_again() -> None:
    """A P1 whose victim search found only a victim claimed by a P0's drain gets
    it once that claim lapses (the P0 started elsewhere). (Fails while a claim
    lapsing in ``_overdue_drains`` leaves the ``_barren`` cache of the P1 valid:
    the P1 then waits for the whole overrunning P3 run, up to its timeout.)"""
    d = _full(2, [("quick", 3, QUICK), ("other", 2, {**LONG, "preemptible": False})], at=0.15)
    d.submit(req("p0", 0, 0.15))
    d.submit(req("p1", 1, 0.15))
    assert d.step() == []  # the P0 drains quick; nothing is left for the P1
    assert d.sched.get("quick").claimed_for == 0
    d.now = 0.16
    d.finish("other")
    assert ids(d.step()) == ["p0"]
    out = d.advance(2.0)  # quick overruns its estimate: the P1 takes its slot
    assert [(type(x), x.request_id) for x in out] == [(Preempt, "quick")]
    assert out[0].for_class == 1  # type: ignore[union-attr]
