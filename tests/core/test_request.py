"""The request lifecycle: the transition table, the total order, determinism."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from laneway.core import (
    TERMINAL,
    TRANSITIONS,
    Decision,
    InvalidTransition,
    LanewayError,
    Request,
    Scheduler,
    State,
)
from laneway.core.request import transition

from .helpers import Driver, ids, req, sched, slots

ALLOWED = sorted(
    ((a, b) for a, targets in TRANSITIONS.items() for b in targets), key=lambda e: (e[0].value, e[1].value)
)
FORBIDDEN = sorted(
    ((a, b) for a, b in itertools.product(State, State) if b not in TRANSITIONS[a]),
    key=lambda e: (e[0].value, e[1].value),
)


def test_table_covers_every_state() -> None:
    assert set(TRANSITIONS) == set(State)
    for state in TERMINAL:
        assert TRANSITIONS[state] == frozenset(), state
    for state in set(State) - TERMINAL:
        assert TRANSITIONS[state], f"{state} is a dead end but not terminal"


def test_documented_edges() -> None:
    # (running: adopted, a request a new scheduler finds running on a worker)
    assert TRANSITIONS[State.NEW] == {State.QUEUED, State.REJECTED, State.RUNNING}
    assert TRANSITIONS[State.QUEUED] == {State.RUNNING, State.EXPIRED, State.CANCELLED, State.REJECTED}
    assert TRANSITIONS[State.RUNNING] == {State.PREEMPTED, State.FINISHED, State.FAILED, State.CANCELLED}
    assert TRANSITIONS[State.PREEMPTED] == {State.QUEUED, State.FINISHED, State.FAILED, State.CANCELLED}


@pytest.mark.parametrize(("src", "dst"), ALLOWED, ids=lambda s: s.value)
def test_allowed_edge(src: State, dst: State) -> None:
    r = req("r", 2)
    r.state = src
    transition(r, dst)
    assert r.state is dst


@pytest.mark.parametrize(("src", "dst"), FORBIDDEN, ids=lambda s: s.value)
def test_forbidden_edge_raises(src: State, dst: State) -> None:
    r = req("r", 2)
    r.state = src
    with pytest.raises(InvalidTransition, match=f"{src.value} -> {dst.value}"):
        transition(r, dst)
    assert r.state is src


def test_new_request_defaults() -> None:
    r = Request("x", 1, 5.0)
    assert r.state is State.NEW
    assert not r.started
    assert r.total_tokens == 0


def test_scheduler_rejects_events_out_of_order() -> None:
    s = sched(1)
    r = req("a", 2)
    assert s.submit(r, 0.0) is None
    with pytest.raises(InvalidTransition):
        s.submit(r, 0.0)  # already submitted
    with pytest.raises(InvalidTransition):
        s.finished("a", 1.0)  # still queued
    with pytest.raises(InvalidTransition):
        s.preempted("a", 1.0)  # never preempted
    s.schedule(0.0)
    with pytest.raises(InvalidTransition):
        s.preempted("a", 1.0)  # running, not preempted
    s.finished("a", 1.0)
    assert r.state is State.FINISHED
    assert "a" not in s


@pytest.mark.parametrize(
    ("kw", "now", "words"),
    [
        ({"arrival_s": math.nan}, 0.0, "arrival_s must be a finite time"),
        ({"arrival_s": math.inf}, 0.0, "arrival_s must be a finite time"),
        ({}, math.nan, "now must be a finite time"),
        ({"est_service_s": math.nan}, 0.0, "est_service_s must be a finite number >= 0"),
        ({"est_service_s": -1.0}, 0.0, "est_service_s must be a finite number >= 0"),
        ({"timeout_s": -5.0}, 0.0, "timeout_s must be >= 0"),
        ({"timeout_s": math.nan}, 0.0, "timeout_s must be >= 0"),
        ({"priority": 9}, 0.0, "unknown class rank 9"),
    ],
)
def test_numbers_no_scheduler_can_take_are_refused_before_anything_is_queued(
    kw: dict[str, float], now: float, words: str
) -> None:
    """Through the core's API, not only its callers' checks: a clear :class:`LanewayError`,
    and the scheduler as before (nothing queued, the next request served)."""
    s = sched(1)
    fields: dict[str, object] = {"arrival_s": 0.0, "priority": 1, **kw}
    with pytest.raises(LanewayError, match=words):
        s.submit(Request("bad", **fields), now)  # type: ignore[arg-type]
    assert s.queued == 0 and "bad" not in s
    assert s.submit(req("ok", 1), 0.0) is None
    assert ids(s.schedule(0.0)) == ["ok"]


def test_an_unknown_rank_or_policy_is_a_laneway_error() -> None:
    s = sched(1)
    with pytest.raises(LanewayError, match="unknown class rank 9: this scheduler's are 0–3"):
        s.estimate_wait(9, None, 0.0)
    with pytest.raises(LanewayError, match="unknown class rank -1"):
        s.estimate_range(-1, None, 0.0)
    with pytest.raises(LanewayError, match="unknown policy 'nope'"):
        Scheduler(slots(1), policy_name="nope")


def test_fifo_inside_a_class_by_arrival_then_seq() -> None:
    s = sched(1, aging_interval_s=None)
    d = Driver(s)
    # submitted out of arrival order; ties on arrival go by submission order
    d.submit(req("late", 2, 3.0))
    d.submit(req("tie1", 2, 1.0))
    d.submit(req("early", 2, 0.5))
    d.submit(req("tie2", 2, 1.0))
    order: list[str] = []
    d.now = 4.0
    for _ in range(4):
        started = ids(d.step())
        assert len(started) == 1
        order += started
        d.finish(started[0])
    assert order == ["early", "tie1", "tie2", "late"]


def test_class_before_arrival() -> None:
    s = sched(1)
    d = Driver(s)
    d.submit(req("p3", 3, 0.0))
    d.submit(req("p2", 2, 0.1))
    d.submit(req("p1", 1, 0.2))
    d.submit(req("p0", 0, 0.3))
    d.now = 0.3
    order: list[str] = []
    for _ in range(4):
        started = ids(d.step())
        order += started
        d.finish(started[0])
    assert order == ["p0", "p1", "p2", "p3"]


def _script(seed: int, policy: str) -> list[tuple[float, Decision]]:
    rng = random.Random(seed)
    d = Driver(sched(3, policy))
    for i in range(60):
        d.submit(req(f"r{i}", rng.randrange(4), d.now, est_service_s=rng.choice([None, 0.05, 5.0, 50.0])))
        d.advance(rng.choice([0.0, 0.01, 0.5, 3.0]))
        for rid in sorted(d.stopping):
            if rng.random() < 0.7:
                d.ack(rid)
        for rid in sorted(d.running):
            if rid not in d.stopping and rng.random() < 0.3:
                d.finish(rid)
        d.step()
    d.drain()
    return d.log


@pytest.mark.parametrize("policy", ["fifo", "priority", "graceful", "mlfq", "laneway"])
def test_same_input_same_decisions(policy: str) -> None:
    first = _script(7, policy)
    assert first  # it did decide things
    assert _script(7, policy) == first
    assert _script(8, policy) != first


def test_the_core_changes_a_state_through_the_table_only() -> None:
    """Outside the lifecycle's own module, the core changes ``.state`` only through
    :func:`transition`, or (on the hot paths) right after checking the table itself: an
    ``if NEW not in TRANSITIONS[x.state]`` (or its alias ``_NEXT``) just before the write."""
    import ast

    import laneway.core

    def checked(prev: ast.stmt | None, target: ast.Attribute, value: ast.expr) -> bool:
        if not isinstance(prev, ast.If) or not isinstance(prev.test, ast.Compare):
            return False
        test = prev.test
        table = test.comparators[0] if test.comparators else None
        return (
            isinstance(test.ops[0], ast.NotIn)
            and ast.unparse(test.left) == ast.unparse(value)
            and isinstance(table, ast.Subscript)
            and isinstance(table.value, ast.Name)
            and table.value.id in ("TRANSITIONS", "_NEXT")
            and ast.unparse(table.slice) == ast.unparse(target)
        )

    root = Path(laneway.core.__path__[0])
    unchecked = []
    writes = 0
    for path in sorted(root.glob("*.py")):
        if path.name == "request.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            body = getattr(node, "body", None)
            if not isinstance(body, list):
                continue
            for blk in (body, getattr(node, "orelse", []) or []):
                for i, stmt in enumerate(blk):
                    if (
                        isinstance(stmt, ast.AugAssign | ast.AnnAssign)
                        and getattr(stmt.target, "attr", "") == "state"
                    ):
                        unchecked.append(f"{path.name}:{stmt.lineno}")
                    if not isinstance(stmt, ast.Assign):
                        continue
                    for t in stmt.targets:
                        if isinstance(t, ast.Attribute) and t.attr == "state":
                            writes += 1
                            if not checked(blk[i - 1] if i else None, t, stmt.value):
                                unchecked.append(f"{path.name}:{stmt.lineno}")
    assert unchecked == []
    assert writes >= 3  # (the hot paths' checked writes: the test sees them)
