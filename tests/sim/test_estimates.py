"""Wait estimates, judged among the requests that waited (the figure that says
something), and the calibration that corrects them from the waits that followed."""

from __future__ import annotations

import math

import pytest

from laneway.core.measures import Calibration
from laneway.sim.report import estimate_errors, summarize, waited_errors
from laneway.sim.scenarios import scenario
from laneway.sim.simulation import simulate


def test_calibration_learns_the_ratio_and_ignores_what_teaches_nothing() -> None:
    c = Calibration(2, weight=0.1)
    for _ in range(200):
        c.learn(1, 10.0, 20.0)  # waits twice what was estimated
    assert c.factor[1] == pytest.approx(2.0, rel=0.01)
    assert c.factor[0] == 1.0  # (per class)
    c.learn(0, 0.2, 0.5)  # both under a second: nothing to learn
    c.learn(0, math.inf, 5.0)  # no worker was up: not an estimate
    assert c.n[0] == 0 and c.factor[0] == 1.0
    c.learn(0, 1.0, 1e9)  # one wild sample moves it, boundedly
    assert c.factor[0] == pytest.approx(math.exp(3.0))
    for _ in range(300):
        c.learn(0, 8.0, 4.0)
    assert c.factor[0] == pytest.approx(0.5, rel=0.02)  # and it comes back


@pytest.mark.parametrize(
    ("name", "classes"),
    [("code-review", ("P2",)), ("mixed", ("P1", "P2", "P3")), ("support-desk", ("P2", "P3"))],
)
def test_estimates_of_the_requests_that_waited_are_within_a_quarter_at_the_median(
    name: str, classes: tuple[str, ...]
) -> None:
    """laneway on its scenarios: per class (with enough requests that waited), the
    median error is measured at 0.07-0.23; the bound leaves room. (support-desk's P1,
    0.48, waits for the first of 16 requests of unknown sizes to end: not bounded here.)"""
    sc = scenario(name, 0)
    res = simulate(sc.requests, slots=sc.slots, policy="laneway", scenario=sc.name)
    summary = summarize(res)
    for cls in classes:
        err = summary["classes"][cls]["estimate_error"]
        assert err["waited"] >= 5
        assert err["median"] <= 0.3, (cls, err)
    # the old figure counted requests that never waited too (their estimate is easy: 0)
    assert summary["estimate_error"]["waited"] == len(waited_errors(res.outcomes))
    assert len(estimate_errors(res.outcomes)) > len(waited_errors(res.outcomes))
