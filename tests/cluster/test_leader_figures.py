"""A replica's reading of what the leader publishes, and of when it gives up on a request."""

from __future__ import annotations

import math

import pytest

from laneway.cluster.leader_figures import LeaderFigures
from laneway.cluster.local_deadlines import LOCAL_GRACE_S, LocalDeadlines


def test_a_models_wait_falls_back_to_its_class_and_missing_figures_are_unknown() -> None:
    fig = LeaderFigures().read(
        {
            "wait": {"P1": 2.0, "P1|m": 0.5, "P2": None},
            "range": {"P1": [0.1, None, "measured", "from 9 runs"], "P2": [1, 2]},
            "queued": {"P1": 3},
            "leader": "r1.abcd",
        }
    )
    assert fig.wait("P1", "m") == 0.5 and fig.wait("P1", "other") == 2.0 and fig.wait("P1", None) == 2.0
    assert fig.wait("P2", None) == math.inf and fig.wait("P3", "m") == math.inf
    r = fig.range("P1", "m")
    assert (r.low_s, r.high_s, r.basis) == (0.1, math.inf, "measured")
    assert fig.range("P2", None).basis == "none"  # (malformed: left out)
    assert (fig.queued, fig.leader) == ({"P1": 3}, "r1.abcd")


def test_malformed_fleet_pace_and_failing_figures_are_left_out() -> None:
    fig = LeaderFigures().read(
        {"pace": [1], "fleet": {"replicas": []}, "failing": {"m": ["why"], "n": ["no", "x"]}}
    )
    assert (fig.pace, fig.fleet, fig.failing) == (None, None, {})
    fig.read({"pace": {"m": 30.0}, "fleet": {"replicas": {"r1": 1}}, "failing": {"m": ["oom", 1e12]}})
    assert fig.pace == {"m": 30.0} and fig.fleet == {"replicas": {"r1": 1}}
    assert fig.failing is not None and fig.failing["m"][0] == "oom" and fig.failing["m"][1] > 0


def test_a_request_is_given_up_on_past_its_timeout_unless_back_with_the_leader_while_connected() -> None:
    d = LocalDeadlines()
    d.arm("new", 10.0, 0.0)
    d.arm("back", 10.0, 0.0, back=True)
    d.arm("endless", math.inf, 0.0)
    d.arm("none", None, 0.0)
    assert d.next() == pytest.approx(10.0 + LOCAL_GRACE_S)
    assert d.due(10.0, connected=True) == []
    assert d.due(10.0 + LOCAL_GRACE_S, connected=True) == ["new"]  # ("back" renews)
    assert d.next() == pytest.approx(2 * (10.0 + LOCAL_GRACE_S))
    assert d.due(100.0, connected=False) == ["back"]  # (out of reach: given up on)
    assert d.next() == math.inf
    d.arm("x", 1.0, 0.0)
    d.drop("x")
    assert d.due(100.0, connected=False) == []
