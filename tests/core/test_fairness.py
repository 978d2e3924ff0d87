"""Token-fair tenants inside a class (laneway.core.fairness) and token-per-minute quotas."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laneway.core import Dispatch, Reject, Scheduler, SchedulerConfig, WorkerSpec
from laneway.core.admission import TenantPolicy, TokenQuota

from .helpers import Driver, ids, req

DECODE = 30.0  # tokens a second (the default cost model's)

jobs = st.lists(st.tuples(st.integers(0, 400), st.integers(1, 400)), min_size=5, max_size=25)


def duration(prompt: int, output: int) -> float:
    return prompt / 8000.0 + output / DECODE


@settings(max_examples=60, deadline=None)
@given(
    slots=st.integers(1, 4),
    weights=st.tuples(st.sampled_from([1.0, 2.0, 3.0]), st.sampled_from([1.0, 2.0, 3.0])),
    a_jobs=jobs,
    b_jobs=jobs,
)
def test_no_backlogged_tenant_falls_behind_another_by_more_than_the_bound(
    slots: int, weights: tuple[float, float], a_jobs: list[tuple[int, int]], b_jobs: list[tuple[int, int]]
) -> None:
    """Both tenants backlogged from the start: at every dispatch while both still have
    work queued, the weighted tokens each has been given (started), over its weight,
    differ by at most one request's cost of each (start-time fair queueing's bound)."""
    tenants = {"a": TenantPolicy(weight=weights[0]), "b": TenantPolicy(weight=weights[1])}
    cfg = SchedulerConfig(tenants=tenants, aging_interval_s=None)
    d = Driver(Scheduler([WorkerSpec(f"w{i}", 1) for i in range(slots)], cfg, "laneway"))
    fair = d.sched.fair
    assert fair is not None
    size: dict[str, tuple[int, int]] = {}
    for name, js in (("a", a_jobs), ("b", b_jobs)):
        for i, (p, o) in enumerate(js):
            rid = f"{name}{i}"
            size[rid] = (p, o)
            d.submit(req(rid, 2, 0.0, tenant=name, prompt_tokens=p, output_tokens=o, timeout_s=math.inf))
    cost = {rid: fair.cost(p, o) for rid, (p, o) in size.items()}
    bound = max(cost[r] for r in cost if r[0] == "a") / weights[0]
    bound += max(cost[r] for r in cost if r[0] == "b") / weights[1]
    given_ = {"a": 0.0, "b": 0.0}
    left = {"a": len(a_jobs), "b": len(b_jobs)}
    ends: dict[str, float] = {}
    worst = 0.0
    for _ in range(2 * (len(a_jobs) + len(b_jobs)) + 5):
        for x in d.step():
            assert type(x) is Dispatch
            t = x.request_id[0]
            given_[t] += cost[x.request_id]
            left[t] -= 1
            ends[x.request_id] = d.now + duration(*size[x.request_id])
            if left["a"] > 0 and left["b"] > 0:  # both still backlogged
                gap = abs(given_["a"] / weights[0] - given_["b"] / weights[1])
                worst = max(worst, gap)
                assert gap <= bound + 1e-6, (gap, bound)
        if not ends:
            break
        rid = min(ends, key=ends.__getitem__)
        d.now = ends.pop(rid)
        d.finish(rid)
    assert not d.sched.live or ends


def test_a_small_tenant_waits_for_its_own_work_not_a_big_ones() -> None:
    cfg = SchedulerConfig(aging_interval_s=None)
    d = Driver(Scheduler([WorkerSpec("w0", 1)], cfg, "laneway"))
    for i in range(20):
        d.submit(req(f"big{i}", 2, 0.0, tenant="big", prompt_tokens=100, output_tokens=300))
    assert ids(d.step()) == ["big0"]
    d.now = 1.0
    d.submit(req("small0", 2, 1.0, tenant="small", prompt_tokens=100, output_tokens=300))
    d.finish("big0")
    assert ids(d.step()) == ["small0"]  # not behind the 19 queued
    off = Driver(Scheduler([WorkerSpec("w0", 1)], SchedulerConfig(fair_tenants=False), "laneway"))
    for i in range(3):
        off.submit(req(f"big{i}", 2, 0.0, tenant="big"))
    assert ids(off.step()) == ["big0"]
    off.submit(req("small0", 2, 1.0, tenant="small"))
    off.finish("big0")
    assert ids(off.step()) == ["big1"]  # FIFO inside the class


def test_a_tenant_coming_back_banks_no_credit_and_the_other_is_not_punished() -> None:
    """``a`` had the class to itself for a long while, then ``b`` comes with a backlog:
    from then on they alternate — ``b`` gets no head start for the time it sent nothing,
    ``a`` no penalty for having used the idle slots."""
    cfg = SchedulerConfig(aging_interval_s=None)
    d = Driver(Scheduler([WorkerSpec("w0", 1)], cfg, "laneway"))
    for i in range(60):
        d.submit(req(f"a{i}", 2, 0.0, tenant="a", prompt_tokens=0, output_tokens=30))  # 1 s each
    order: list[str] = []
    for _ in range(40):  # a alone for 40 s
        (rid,) = ids(d.step())
        order.append(rid)
        d.now += 1.0
        d.finish(rid)
    for i in range(20):
        d.submit(req(f"b{i}", 2, d.now, tenant="b", prompt_tokens=0, output_tokens=30))
    for _ in range(20):
        (rid,) = ids(d.step())
        order.append(rid)
        d.now += 1.0
        d.finish(rid)
    after = order[40:]
    assert 8 <= sum(r.startswith("b") for r in after) <= 12, after  # about half each


def test_a_request_that_ends_early_gives_back_what_it_was_charged_beyond_its_tokens() -> None:
    d = Driver(Scheduler([WorkerSpec("w0", 1)], SchedulerConfig(aging_interval_s=None), "laneway"))
    fair = d.sched.fair
    assert fair is not None
    d.submit(req("x", 2, 0.0, tenant="t", prompt_tokens=10, output_tokens=1000))
    before = fair.counter[(2, "t")]
    assert ids(d.step()) == ["x"]
    d.now = 1.0
    d.sched.finished("x", 1.0, tokens=10)  # it stopped after 10 tokens
    assert fair.counter[(2, "t")] < before
    assert fair.received[(2, "t")] == pytest.approx(fair.cost(10, 10))


def test_a_token_per_minute_quota_charges_prompts_and_output_as_they_come() -> None:
    tenants = {"t": TenantPolicy(token_quotas={2: TokenQuota(600.0)})}  # 10 tokens a second
    d = Driver(Scheduler([WorkerSpec("w0", 4)], SchedulerConfig(tenants=tenants), "laneway"))
    for i in range(6):  # 6 x 100 prompt tokens: the minute's 600
        assert d.submit(req(f"r{i}", 2, 0.0, tenant="t", prompt_tokens=100)) is None
    got = d.sched.submit(req("r6", 2, 0.0, tenant="t", prompt_tokens=100), 0.0)
    assert isinstance(got, Reject) and got.reason == "rate_limited" and "tokens/min" in got.message
    assert got.retry_after_s == pytest.approx(0.1, abs=0.01)  # one token's refill at 10/s
    assert got.estimated_wait_s == got.retry_after_s
    d.now = 1.0  # 10 tokens back
    assert ids(d.step()) == ["r0", "r1", "r2", "r3"]
    d.sched.progress("r0", 50, 1.0)  # output as it streams: the bucket goes into debt
    got = d.sched.submit(req("r7", 2, 1.0, tenant="t", prompt_tokens=1), 1.0)
    assert isinstance(got, Reject) and got.retry_after_s == pytest.approx(4.1, abs=0.05)
    d.sched.submit(req("other", 2, 1.0, tenant="u", prompt_tokens=100), 1.0)  # others are not held
    assert d.sched.get("other").tenant == "u"


def test_a_cancelled_or_failed_request_is_charged_the_tokens_it_streamed() -> None:
    """Progress is reported now and then (16, 48, ... tokens); what streamed after the
    last report is charged when the request is cancelled or fails, not forgiven."""
    tenants = {"t": TenantPolicy(token_quotas={2: TokenQuota(600.0)})}  # 10 tokens a second
    d = Driver(Scheduler([WorkerSpec("w0", 4)], SchedulerConfig(tenants=tenants), "laneway"))
    budget = d.sched.admission._budget
    quota = tenants["t"].token_quotas[2]
    for rid in ("c", "f"):
        assert d.submit(req(rid, 2, 0.0, tenant="t", prompt_tokens=10)) is None
    assert ids(d.step()) == ["c", "f"]
    d.sched.progress("c", 16, 0.0)
    assert budget("t", 2, quota, 0.0).tokens == pytest.approx(600 - 20 - 16)
    assert d.sched.cancel("c", 0.0, tokens=40)  # the client left after 40 tokens
    assert budget("t", 2, quota, 0.0).tokens == pytest.approx(600 - 20 - 40)
    d.sched.finished("f", 0.0, failed=True, tokens=500)  # the worker failed after 500
    assert budget("t", 2, quota, 0.0).tokens == pytest.approx(600 - 20 - 540)
    got = d.sched.submit(req("next", 2, 0.0, tenant="t", prompt_tokens=100), 0.0)
    assert got is None  # (40 left: admitted, and the bucket goes into debt)
    got = d.sched.submit(req("after", 2, 0.0, tenant="t", prompt_tokens=1), 0.0)
    assert isinstance(got, Reject) and got.reason == "rate_limited"


def test_a_cancelled_request_counts_in_its_tenants_share_by_what_it_made() -> None:
    d = Driver(Scheduler([WorkerSpec("w0", 1)], SchedulerConfig(aging_interval_s=None), "laneway"))
    fair = d.sched.fair
    assert fair is not None
    for rid in ("run", "wait"):
        d.submit(req(rid, 2, 0.0, tenant="t", prompt_tokens=10, output_tokens=100))
    assert ids(d.step()) == ["run"]
    start = fair.counter[(2, "t")]
    d.sched.cancel("wait", 0.5)  # never ran: all but its prompt goes back
    back = start - fair.counter[(2, "t")]
    assert back == pytest.approx(fair._seconds("t", fair.cost(0, 100)))
    d.sched.cancel("run", 0.5, tokens=300)  # ran past its size before the client left
    assert fair.counter[(2, "t")] - (start - back) == pytest.approx(fair._seconds("t", fair.cost(0, 200)))
    assert fair.received[(2, "t")] == pytest.approx(fair.cost(10, 0) + fair.cost(10, 300))


def test_a_token_quota_holds_a_requests_size_from_admission_and_gives_back_the_unused() -> None:
    """One positive balance cannot start many long requests: each takes its prompt and
    its size (max_tokens) at once; what it does not make comes back when it ends."""
    tenants = {"t": TenantPolicy(token_quotas={2: TokenQuota(6.0, burst=600)})}  # 0.1 token a second
    d = Driver(Scheduler([WorkerSpec("w0", 8)], SchedulerConfig(tenants=tenants), "laneway"))
    budget = d.sched.admission._budget("t", 2, tenants["t"].token_quotas[2], 0.0)
    got = [
        d.sched.submit(req(f"r{i}", 2, 0.0, tenant="t", prompt_tokens=10, output_tokens=190), 0.0)
        for i in range(5)
    ]
    assert [g is None for g in got] == [True, True, True, False, False]  # 600 -> 400 -> 200 -> 0
    assert isinstance(got[3], Reject) and got[3].reason == "rate_limited"
    assert budget.tokens == pytest.approx(0.0)
    assert ids(d.step()) == ["r0", "r1", "r2"]
    d.sched.progress("r0", 16, 0.0)  # within its size: nothing more
    assert budget.tokens == pytest.approx(0.0)
    d.sched.finished("r0", 0.0, tokens=40)  # 150 of its 190 never made: back
    assert budget.tokens == pytest.approx(150.0)
    d.sched.finished("r1", 0.0, tokens=250)  # past its size (ignore_eos upstream, say): the rest
    assert budget.tokens == pytest.approx(90.0)
    d.sched.cancel("r2", 0.0, tokens=0)
    assert budget.tokens == pytest.approx(280.0)
    assert d.sched.submit(req("r5", 2, 0.0, tenant="t", prompt_tokens=10, output_tokens=190), 0.0) is None
    d.sched.cancel("r5", 0.0)  # queued, never ran: all of its size back (its prompt stays charged)
    assert budget.tokens == pytest.approx(270.0)


def test_a_token_quota_is_settled_on_the_prompt_the_engine_counted() -> None:
    """The prompt is charged as estimated on admission (characters / 4); at its end the
    real count replaces the estimate, and a request the engine refused before doing
    anything (too long for the context, ids past the vocabulary) costs nothing."""
    tenants = {"t": TenantPolicy(token_quotas={2: TokenQuota(6.0, burst=1000)})}
    d = Driver(Scheduler([WorkerSpec("w0", 4)], SchedulerConfig(tenants=tenants), "laneway"))
    budget = d.sched.admission._budget("t", 2, tenants["t"].token_quotas[2], 0.0)
    for rid in ("ok", "refused"):
        assert d.submit(req(rid, 2, 0.0, tenant="t", prompt_tokens=100, output_tokens=50)) is None
    assert budget.tokens == pytest.approx(1000 - 300)
    assert ids(d.step()) == ["ok", "refused"]
    d.sched.finished("ok", 0.0, tokens=50, prompt_tokens=400)  # a byte-level tokenizer: 4x the estimate
    assert budget.tokens == pytest.approx(1000 - 300 - 300)
    d.sched.finished("refused", 0.0, failed=True, tokens=0, prompt_tokens=0)
    assert budget.tokens == pytest.approx(1000 - 450)  # all of the refused one's charge back
