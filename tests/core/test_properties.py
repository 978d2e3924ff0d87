"""Property tests: random workers and random event streams, driven like the
simulator, for every policy; invariants checked after every step."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, currently_in_test_context, given, note, settings
from hypothesis import strategies as st

from laneway.core import (
    POLICIES,
    TERMINAL,
    Decision,
    Dispatch,
    Preempt,
    Quota,
    Reject,
    Request,
    Scheduler,
    SchedulerConfig,
    State,
    TenantPolicy,
    WorkerSpec,
)
from laneway.core.decisions import REJECT_REASONS
from laneway.core.victims import may_stop_again

from .helpers import Driver

PROPS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TENANTS = {
    "quota": TenantPolicy(quotas={0: Quota(1.0, burst=2.0), 1: Quota(2.0)}, max_queued=6),
    "batch": TenantPolicy(allowed=frozenset({2, 3}), max_concurrent=5),
}

# -- strategies ---------------------------------------------------------------
workers_st = st.lists(st.tuples(st.integers(1, 2), st.booleans()), min_size=1, max_size=3).map(
    lambda ws: [WorkerSpec(f"w{i}", n, can_checkpoint=c) for i, (n, c) in enumerate(ws)]
)

config_st = st.builds(
    SchedulerConfig,
    aging_interval_s=st.sampled_from([None, 5.0, 30.0]),
    aging_ceiling=st.integers(0, 3),
    drain_cap_s=st.sampled_from([0.5, 5.0, 30.0]),
    max_preemptions=st.sampled_from([None, None, 0, 1, 3]),
    max_preempt_loss=st.sampled_from([None, 0.0, 0.05, 0.25]),
    max_queued_total=st.sampled_from([None, 4, 10]),
    tenants=st.just(TENANTS),
    mlfq_slice_s=st.sampled_from([2.0, 20.0]),
    mlfq_levels=st.integers(1, 3),
    placement=st.sampled_from(["prefix", "least-loaded", "round-robin"]),
)

# An event is one integer, decoded below: one draw per event keeps generation
# cheap (drawing nested tuples cost more than running the scheduler).
_KINDS = ["submit"] * 8 + ["finish"] * 3 + ["ack"] * 2 + ["cancel"] + ["advance"] * 3 + ["first"]
_HINTS = [None, None, 0.05, 0.2, 3.0, 30.0, 300.0]
_TIMEOUTS = [None, None, None, 2.0, 400.0, math.inf]
_TENANTS = [None, None, "quota", "batch"]
_STEPS = [0.0, 0.01, 0.1, 1.0, 5.0, 20.0, 100.0]
_PREFIXES: list[tuple[int, ...]] = [(), (1, 2, 3), (1, 2, 4), (7,), (1, 2, 3), ()]


def decode(n: int) -> tuple[object, ...]:
    """The event an integer stands for: mostly arrivals, so slots are contended."""
    kind = _KINDS[n % len(_KINDS)]
    n //= len(_KINDS)
    if kind == "submit":
        cls, n = n % 4, n // 4
        hint, n = _HINTS[n % len(_HINTS)], n // len(_HINTS)
        preemptible, n = n % 4 != 3, n // 4
        timeout, n = _TIMEOUTS[n % len(_TIMEOUTS)], n // len(_TIMEOUTS)
        tenant, n = _TENANTS[n % len(_TENANTS)], n // len(_TENANTS)
        dep = None if n % 3 else (n // 3) % 41
        return ("submit", cls, hint, preemptible, timeout, tenant, dep)
    if kind == "finish":
        return ("finish", n % 41, (n // 41) % 4 == 3)
    if kind == "advance":
        return ("advance", _STEPS[n % len(_STEPS)])
    return (kind, n % 61)


events_st = st.lists(st.integers(0, 2**31 - 1), min_size=20, max_size=60).map(
    lambda ns: [decode(n) for n in ns]
)


@dataclass
class Run:
    driver: Driver
    reqs: dict[str, Request]


Check = Callable[[Driver, dict[str, Request], list[Decision]], None]


def _no_check(d: Driver, reqs: dict[str, Request], out: list[Decision]) -> None:
    return None


def run(
    workers: list[WorkerSpec],
    cfg: SchedulerConfig,
    policy: str,
    events: list[tuple[object, ...]],
    check: Check = _no_check,
    *,
    deps: bool = True,
) -> Run:
    d = Driver(Scheduler(workers, cfg, policy))
    reqs: dict[str, Request] = {}
    if currently_in_test_context():
        note(f"events: {events}")

    def step() -> None:
        out = d.step()  # applies the decisions and checks the scheduler's invariants
        check(d, reqs, out)

    for ev in events:
        kind = ev[0]
        if kind == "submit":
            _, cls, hint, preemptible, timeout, tenant, dep = ev
            rid = f"r{len(d.submitted)}"
            depends = (d.submitted[dep],) if deps and dep is not None and dep < len(d.submitted) else ()
            r = Request(
                rid,
                cls,  # type: ignore[arg-type]
                d.now,
                tenant=tenant,  # type: ignore[arg-type]
                preemptible=preemptible,  # type: ignore[arg-type]
                timeout_s=timeout,  # type: ignore[arg-type]
                est_service_s=hint,  # type: ignore[arg-type]
                depends_on=depends,
                prefix=(prefix := _PREFIXES[len(d.submitted) % len(_PREFIXES)]),  # (a few, often shared)
                prompt_tokens=32 * len(prefix) + 20,  # (the blocks, and some past them)
            )
            reqs[rid] = r
            rej = d.submit(r)
            if rej is not None:
                assert rej.reason in REJECT_REASONS
                assert r.state is State.REJECTED
        elif kind == "finish":
            if d.running:
                d.finish(sorted(d.running)[ev[1] % len(d.running)], failed=bool(ev[2]))  # type: ignore[operator]
        elif kind == "ack":
            if d.stopping:
                d.ack(sorted(d.stopping)[ev[1] % len(d.stopping)])  # type: ignore[operator]
        elif kind == "first":  # a running request's first token: its prompt is prefilled
            if d.running:
                d.sched.first_token(sorted(d.running)[ev[1] % len(d.running)], d.now)  # type: ignore[operator]
        elif kind == "cancel":
            if d.submitted:
                d.cancel(d.submitted[ev[1] % len(d.submitted)])  # type: ignore[operator]
        else:
            target = d.now + ev[1]  # type: ignore[operator]
            spins = 0
            while (wake := d.sched.next_wakeup()) <= target:
                spins = spins + 1 if wake <= d.now else 0
                assert spins < 5, f"next_wakeup() stays at {wake} <= now {d.now}"
                d.now = max(d.now, wake)
                step()
            d.now = target
        step()
    # drain: let everything run to its end
    for _ in range(5_000):
        if not d.sched.live:
            break
        for rid in sorted(d.stopping):
            d.ack(rid)
        step()
        for rid in sorted(d.running):
            if rid not in d.stopping:
                d.finish(rid)
        step()
        d.now += 1.0
        wake = d.sched.next_wakeup()
        if math.isfinite(wake):
            d.now = max(d.now, wake)
        step()
    return Run(d, reqs)


EXPECTED_STATE = {
    "finished": State.FINISHED,
    "failed": State.FAILED,
    "rejected": State.REJECTED,
    "expired": State.EXPIRED,
    "cancelled": State.CANCELLED,
}


def _basic_checks(d: Driver, reqs: dict[str, Request], out: list[Decision]) -> None:
    max_pre = d.sched.cfg.max_preemptions
    max_loss = d.sched.cfg.max_preempt_loss
    # the driver's own view agrees with the scheduler's (independently of check_invariants)
    for rid in d.running:
        assert reqs[rid].state in (State.RUNNING, State.PREEMPTED), rid
    queued = [r.id for r in reqs.values() if r.state is State.QUEUED]
    assert not set(queued) & set(d.running), "a request both queued and running"
    assert len(queued) == d.sched.queued
    assert len(d.running) + d.sched.free_slots == d.sched.slots
    for cls in range(4):
        est = d.sched.estimate_wait(cls, None, d.now)
        assert 0.0 <= est < math.inf, (cls, est)
    for x in out:
        r = reqs[x.request_id]
        if type(x) is Preempt:
            assert r.priority not in (0, 1), f"P{r.priority} request {r.id} preempted"
            assert r.preemptible, f"{r.id} is not preemptible"
            if max_pre is not None:
                assert d.preempt_counts[r.id] <= max_pre, f"{r.id} preempted more than {max_pre} times"
            if max_loss is not None and r.preemptions > 1:  # what it had lost was within its share
                ran = d.now - r.started_s
                check, again = d.sched.costs.round_trips(r.prompt_tokens, r.tokens_done, ran)
                before = r.lost_s - (check if r.resume == "checkpoint" else again)
                assert before <= max_loss * r.est_s + 1e-9, (r.id, before, r.est_s)
            assert r.state is State.PREEMPTED
        elif type(x) is Dispatch:
            assert r.state in (State.RUNNING, State.PREEMPTED)  # (it may be preempted in the same step)
            assert x.request_id in d.running
        else:
            assert type(x) is Reject
            assert x.reason in REJECT_REASONS
            assert x.estimated_wait_s >= 0 and x.retry_after_s >= 0
            assert r.state in (State.EXPIRED, State.REJECTED)


# -- the properties ---------------------------------------------------------------
@pytest.mark.parametrize("policy", sorted(POLICIES))
@PROPS
@given(workers=workers_st, cfg=config_st, events=events_st)
def test_invariants_and_every_request_ends_once(
    policy: str, workers: list[WorkerSpec], cfg: SchedulerConfig, events: list[tuple[object, ...]]
) -> None:
    res = run(workers, cfg, policy, events, _basic_checks)
    d = res.driver
    assert d.sched.live == 0, "the system did not drain"
    assert d.sched.queued == 0
    assert d.sched.free_slots == sum(w.slots for w in workers)
    assert not d.running and not d.stopping
    assert set(d.ended) == set(d.submitted)  # each exactly once: Driver refuses a second end
    for rid, how in d.ended.items():
        assert res.reqs[rid].state is EXPECTED_STATE[how], (rid, how, res.reqs[rid].state)
        assert res.reqs[rid].state in TERMINAL
    c = d.sched.counters
    snap = d.sched.snapshot()
    assert snap.submitted == len(d.submitted)
    assert sum(snap.completed.values()) == sum(1 for h in d.ended.values() if h == "finished")
    assert sum(c.cancelled) == sum(1 for h in d.ended.values() if h == "cancelled")


def _urgency_check(d: Driver, reqs: dict[str, Request], out: list[Decision]) -> None:
    """No Dispatch to R while a request of a more urgent class stays queued,
    unless R had an aging boost."""
    interval = d.sched.cfg.aging_interval_s
    dispatched = [reqs[x.request_id] for x in out if type(x) is Dispatch]
    if not dispatched:
        return
    queued = [r for r in reqs.values() if r.state is State.QUEUED]
    for r in dispatched:
        if interval is not None and d.now - r.arrival_s >= interval:
            continue  # it may have aged past the others
        left = [q.id for q in queued if q.cls < r.cls]
        assert not left, f"{r.id} (class {r.cls}) dispatched while more urgent {left} waited"


@PROPS
@given(workers=workers_st, cfg=config_st, events=events_st)
def test_laneway_never_passes_over_a_more_urgent_class(
    workers: list[WorkerSpec], cfg: SchedulerConfig, events: list[tuple[object, ...]]
) -> None:
    run(workers, cfg, "laneway", events, _urgency_check)


def _preemption_check(d: Driver, reqs: dict[str, Request], out: list[Decision]) -> None:
    started = {x.request_id for x in out if type(x) is Dispatch}
    stopped = {x.request_id for x in out if type(x) is Preempt}
    assert not started & stopped, f"dispatched and preempted in one step: {started & stopped}"
    for rid in stopped:
        r = reqs[rid]
        assert r.cls not in (0, 1), f"{r.id} preempted while it runs at P{r.cls} rank (inherited)"
    # a class with preemption rights and unserved waiting work leaves no victim unclaimed
    s = d.sched
    live = [r for r in reqs.values() if r.id in s]
    for c, pc in enumerate(s.classes.classes):
        victims = {v for v in pc.may_preempt if s.classes[v].preemptible}
        waiting = sum(1 for r in live if r.state is State.QUEUED and r.cls == c)
        claimed = sum(1 for r in live if r.claimed_for == c)
        # (free slots: while a request waits for a stop made where its prompt is cached,
        # those behind it take them next: laneway.core.affinity)
        if not victims or waiting <= claimed + s.free_slots:
            continue
        idle = [
            r.id
            for r in live
            if r.state is State.RUNNING
            and r.cls in victims
            and r.claimed_for is None
            and r.preemptible
            and may_stop_again(r, d.now, s.cfg.max_preempt_loss, s.cfg.max_preemptions)
        ]
        assert not idle, f"{waiting} P{c} waiting with {claimed} claims while {idle} could be preempted"


@pytest.mark.parametrize("policy", ["graceful", "laneway", "mlfq"])
@PROPS
@given(workers=workers_st, cfg=config_st, events=events_st)
def test_preemption_takes_back_no_fresh_dispatch_and_no_inherited_urgency(
    policy: str, workers: list[WorkerSpec], cfg: SchedulerConfig, events: list[tuple[object, ...]]
) -> None:
    """A slot given in a step is not taken back in the same step, and a request
    running at an inherited P0/P1 rank is not preempted."""
    run(workers, cfg, policy, events, _preemption_check)
