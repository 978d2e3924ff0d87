"""An urgent long prefill with no other long prefill beside it (``prefill_guard``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laneway.core import Dispatch, Preempt, Request, Scheduler, SchedulerConfig, WorkerSpec
from laneway.core.prefix_cache import BLOCK_TOKENS
from laneway.core.request import State

from .helpers import Driver


def guarded(**cfg: object) -> Driver:
    config = SchedulerConfig(placement="prefix", prefill_guard=True, **cfg)  # type: ignore[arg-type]
    return Driver(Scheduler([WorkerSpec("a", 4), WorkerSpec("b", 4)], config))


def batch(rid: str, first_block: int) -> Request:
    return Request(rid, 3, 0.0, prompt_tokens=400, prefix=tuple(range(first_block, first_block + 25)))


def miss(rid: str, first_block: int, tokens: int = 1_300) -> Request:
    """An urgent request whose prompt no engine holds."""
    blocks = tuple(range(first_block, first_block + tokens // BLOCK_TOKENS))
    return Request(rid, 0, 0.0, prompt_tokens=tokens, prefix=blocks)


def started(out: list[object]) -> dict[str, str]:
    return {x.request_id: x.worker_id for x in out if isinstance(x, Dispatch)}


def test_an_urgent_miss_prefills_with_no_batch_prefill_and_no_other_miss_beside_it() -> None:
    """Measured on vLLM's CPU build: a ~700-token prompt reached its first token in 2.0 s
    alone, 2.0 s beside three decodes, 3.1 s beside one ~400-token prefill."""
    d = guarded()
    for i in range(4):
        d.submit(batch(f"x{i}", 100 * (i + 1)))
    assert started(d.step()) == {"x0": "a", "x1": "b", "x2": "a", "x3": "b"}
    d.sched.first_token("x0", d.now)  # x0 decodes now; x2 still prefills
    d.submit(miss("u", 1000))
    out = d.step()
    assert started(out) == {"u": "a"}  # (a prefills less than b)
    assert [(x.request_id, x.worker_id) for x in out if isinstance(x, Preempt)] == [("x2", "a")]
    d.ack("x2")
    assert started(d.step()) == {"x2": "b"}  # batch work kept off a: b has a slot
    d.submit(batch("y0", 600))
    d.submit(batch("y1", 700))
    assert started(d.step()) == {"y0": "b"}  # y1 waits, a's two free slots kept from it
    assert d.sched.workers["a"].free == 2 and d.sched.queued == 1 and "y1" not in d.running
    # another miss: not beside u's prefill; a batch request stops on b for it instead
    d.submit(miss("u2", 2000))
    out = d.step()
    stops = [(x.request_id, x.worker_id) for x in out if isinstance(x, Preempt)]
    assert not started(out) and len(stops) == 1 and stops[0][1] == "b"
    d.ack(stops[0][0])
    assert started(d.step()) == {"u2": "b"}
    # an urgent turn whose prompt a holds starts there, beside u's prefill
    d.submit(Request("turn", 0, 0.0, prompt_tokens=1_340, prefix=(*miss("u", 1000).prefix, 5000)))
    assert started(d.step()) == {"turn": "a"}
    # u's first token ends the guard: a scheduling step is due, and batch work starts on a
    assert d.sched.first_token("turn", d.now) is False
    assert d.sched.first_token("u", d.now) is True
    assert d.sched.first_token("u", d.now) is False  # (once)
    got = started(d.step())  # (a's last slot: to the batch work that waited, the one stopped first)
    assert list(got.values()) == ["a"] and set(got) <= {stops[0][0], "y1"}


def test_a_short_or_cached_urgent_prompt_guards_nothing() -> None:
    d = guarded()
    guard = d.sched.dispatcher.guard
    assert guard is not None
    d.submit(batch("x0", 100))
    d.submit(batch("x1", 200))
    d.step()
    d.submit(Request("short", 0, 0.0, prompt_tokens=200, prefix=tuple(range(900, 912))))
    out = d.step()
    assert started(out) and not [x for x in out if isinstance(x, Preempt)] and not guard.guards
    d.submit(miss("u", 1000))
    assert started(d.step()) and len(guard.guards) == 1  # (a miss: it guards)
    d.sched.first_token("u", d.now)
    d.finish("u")
    d.submit(miss("again", 1000))  # (its prompt now held where u ran)
    out = d.step()
    assert started(out) and not [x for x in out if isinstance(x, Preempt)] and not guard.guards


def test_a_guard_ends_with_its_requests_run() -> None:
    """A guard whose request ends (or is cancelled) before its first token keeps nothing off."""
    d = guarded()
    d.submit(miss("u", 1000))
    assert started(d.step()) == {"u": "a"}
    d.submit(batch("x0", 100))
    d.submit(batch("x1", 200))
    assert started(d.step()) == {"x0": "b", "x1": "b"}
    d.cancel("u")
    d.submit(batch("x2", 300))
    assert started(d.step()) == {"x2": "a"}


@pytest.mark.parametrize("on", [False, True])
def test_on_by_default_with_a_switch(on: bool) -> None:
    assert SchedulerConfig().prefill_guard is True
    config = SchedulerConfig(placement="prefix", prefill_guard=on)
    d = Driver(Scheduler([WorkerSpec("a", 4), WorkerSpec("b", 4)], config))
    d.submit(miss("u", 1000))
    assert started(d.step()) == {"u": "a"}
    for i in range(5):
        d.submit(batch(f"x{i}", 100 * (i + 1)))
    got = started(d.step())
    assert list(got.values()).count("b") == 4
    assert ("a" in got.values()) is not on  # (the fifth beside u's prefill, or waiting)
    assert d.sched.first_token("u", d.now) is on


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["miss", "turn", "batch", "first", "finish", "ack", "step"]),
            st.integers(0, 30),
        ),
        max_size=60,
    )
)
def test_guards_never_overfill_a_worker_nor_delay_urgent_work_elsewhere(ops: list[tuple[str, int]]) -> None:
    d = guarded()
    guard = d.sched.dispatcher.guard
    assert guard is not None
    for n, (op, k) in enumerate(ops):
        if op == "miss":
            d.submit(miss(f"m{n}", 10_000 + 100 * (k % 8)))
        elif op == "turn":
            d.submit(
                Request(
                    f"t{n}",
                    1,
                    0.0,
                    prompt_tokens=200,
                    prefix=tuple(range(10_000 + 100 * (k % 8), 10_000 + 100 * (k % 8) + 12)),
                )
            )
        elif op == "batch":
            d.submit(batch(f"b{n}", 50_000 + 100 * k))
        else:
            live = sorted(d.running)
            if live and op in ("first", "finish"):
                rid = live[k % len(live)]
                if op == "first":
                    d.sched.first_token(rid, d.now)
                else:
                    d.finish(rid)
            elif op == "ack" and d.stopping:
                d.ack(sorted(d.stopping)[k % len(d.stopping)])
        d.step()
        d.sched.check_invariants()
        for w in d.sched.workers.values():
            assert len(w.running) <= w.spec.slots
        # urgent work waits while a worker has a free slot only where a guard keeps it off
        # (or a stop made for its cache is under way)
        queued = [r for r in d.sched.live_requests.reqs.values() if r.state is State.QUEUED and r.cls <= 1]
        affinity = d.sched.dispatcher.affinity
        for w in d.sched.workers.values():
            if queued and w.free > 0:
                pending = affinity is not None and any(affinity.pending(r.cls, d.now) for r in queued)
                assert guard.guard_of(w) is not None or pending, (w.id, [r.id for r in queued])
