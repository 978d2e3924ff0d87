"""The ``support-desk`` scenario (P0 chat preempting batch work again and again) and
the preemption bound: P0 does not wait for victims that merely were preempted a few
times before, victims lose at most their share, batch work is all done."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from laneway.core import SchedulerConfig
from laneway.sim.scenarios import scenario
from laneway.sim.simulation import SimResult, simulate


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def waits(res: SimResult, cls: int) -> list[float]:
    return [o.wait_s for o in res.outcomes if o.spec.priority == cls and o.status == "finished"]


@pytest.fixture(scope="module")
def runs() -> dict[str, SimResult]:
    sc = scenario("support-desk", 0)
    out = {
        name: simulate(sc.requests, slots=sc.slots, policy="laneway", config=cfg, check=True)
        for name, cfg in (
            ("bound", SchedulerConfig()),
            ("count cap 3", SchedulerConfig(max_preemptions=3, max_preempt_loss=None)),
        )
    }
    out["priority"] = simulate(sc.requests, slots=sc.slots, policy="priority")
    return out


def test_the_scenario_has_its_shape() -> None:
    sc = scenario("support-desk", 0)
    assert sc.slots == 16
    by_class = Counter(r.priority for r in sc.requests)
    assert by_class[0] > 3000 and by_class[1] > 100 and by_class[2] >= 4 * 500 and by_class[3] == 8
    batches = Counter(r.arrival_s for r in sc.requests if r.priority == 2)
    assert sorted(batches) == [0.0, 1800.0, 3600.0, 5400.0]  # each batch arrives at once
    assert max(r.arrival_s for r in sc.requests) < 2 * 3600.0
    assert scenario("support-desk", 0).requests == sc.requests  # (the same seed, the same day)


def test_p0_waits_under_a_second_at_p99_and_all_batch_work_is_done(runs: dict[str, SimResult]) -> None:
    res = runs["bound"]
    assert p99(waits(res, 0)) <= 1.0
    for cls in (2, 3):  # done, or refused by its own timeout
        statuses = Counter(o.status for o in res.outcomes if o.spec.priority == cls)
        assert set(statuses) <= {"finished", "expired"}, statuses
    done = {
        name: sum(o.status == "finished" for o in r.outcomes if o.spec.priority >= 2)
        for name, r in runs.items()
    }
    assert done["bound"] >= done["count cap 3"]


def test_the_count_cap_made_p0_wait_and_the_bound_does_not(runs: dict[str, SimResult]) -> None:
    bound, capped = runs["bound"], runs["count cap 3"]
    assert p99(waits(bound, 0)) < p99(waits(capped, 0)) / 2
    assert max(waits(bound, 0)) < max(waits(capped, 0))
    assert max(o.req.preemptions for o in capped.outcomes) == 3
    assert max(o.req.preemptions for o in bound.outcomes) > 3  # preempted more often ...


def test_no_victim_lost_more_than_its_share(runs: dict[str, SimResult]) -> None:
    share = SchedulerConfig().max_preempt_loss
    assert share is not None
    costs = runs["bound"].scheduler.costs
    for o in runs["bound"].outcomes:
        r = o.req
        if r.preemptions:  # ... yet each lost little: at most its share, plus the last one
            ck, rc = costs.round_trips(r.prompt_tokens, r.tokens_done, 0.0)
            worst_one = max(ck, rc) + costs.step_s
            assert r.lost_s <= share * r.est_s + worst_one, (r.id, r.lost_s)


def test_urgent_classes_beat_strict_priority(runs: dict[str, SimResult]) -> None:
    assert p99(waits(runs["bound"], 0)) < p99(waits(runs["priority"], 0))
    assert p99(waits(runs["bound"], 1)) < p99(waits(runs["priority"], 1))
