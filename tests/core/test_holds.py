"""A slot freed by an urgent class is kept a moment for its next request (``hold_s``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laneway.core import ConfigError, Dispatch, Preempt, SchedulerConfig
from laneway.core.holds import Holds

from .helpers import Driver, ids, req, sched


def test_the_next_p0_takes_the_held_slot_and_preempts_nothing() -> None:
    d = Driver(sched(1, hold_s=0.25))
    d.submit(req("p0a", 0))
    assert ids(d.step(), Dispatch) == ["p0a"]
    d.submit(req("p3", 3))
    d.now = 1.0
    d.finish("p0a")
    assert d.step() == []  # the P3 may not take the slot the P0 freed yet
    d.now = 1.01
    d.submit(req("p0b", 0, 1.01))
    out = d.step()
    assert ids(out, Dispatch) == ["p0b"] and not ids(out, Preempt)
    assert d.sched.holds.count == 0  # (used)


def test_a_hold_lapses_and_the_waiting_work_starts_then() -> None:
    d = Driver(sched(1, hold_s=0.25))
    d.submit(req("p0", 0))
    d.step()
    d.submit(req("p3", 3))
    d.now = 2.0
    d.finish("p0")
    assert d.step() == []
    assert d.sched.next_wakeup() == 2.25
    out = d.advance(0.3)
    assert ids(out, Dispatch) == ["p3"]
    assert d.sched.holds.count == 0


def test_without_hold_the_slot_goes_at_once_and_the_next_p0_preempts() -> None:
    d = Driver(sched(1))
    d.submit(req("p0a", 0))
    d.step()
    d.submit(req("p3", 3))
    d.finish("p0a")
    assert ids(d.step(), Dispatch) == ["p3"]
    d.submit(req("p0b", 0))
    assert ids(d.step(), Preempt) == ["p3"]


def test_a_hold_keeps_the_slot_only_from_classes_its_class_may_preempt() -> None:
    d = Driver(sched(1, hold_s=0.25))
    d.submit(req("p0", 0))
    d.step()
    d.submit(req("p1", 1))  # (P0 may not preempt P1: the slot is P1's at once)
    d.finish("p0")
    assert ids(d.step(), Dispatch) == ["p1"]
    assert d.sched.holds.count == 1  # (still held for P0, and no slot left free: harmless)


def test_classes_without_rights_hold_nothing_and_failures_hold_nothing() -> None:
    d = Driver(sched(1, hold_s=0.25))
    d.submit(req("p2", 2))
    d.step()
    d.submit(req("p3", 3))
    d.finish("p2")
    assert ids(d.step(), Dispatch) == ["p3"]
    d.submit(req("p0", 0))
    d.finish("p3")
    d.step()
    d.submit(req("p3b", 3))
    d.finish("p0", failed=True)
    assert ids(d.step(), Dispatch) == ["p3b"]


def test_only_the_held_slots_are_kept() -> None:
    d = Driver(sched(3, hold_s=0.25))
    d.submit(req("p0", 0))
    d.step()
    for i in range(3):
        d.submit(req(f"p3-{i}", 3))
    out = d.step()
    assert len(ids(out, Dispatch)) == 2  # two free slots, none held
    d.finish("p0")
    assert d.step() == []  # one slot free, and it is held
    d.finish(ids(out, Dispatch)[0])
    assert len(ids(d.step(), Dispatch)) == 1  # a P3's slot is anyone's


def test_config_rejects_a_negative_hold() -> None:
    with pytest.raises(ConfigError, match="hold_s"):
        SchedulerConfig(hold_s=-1.0)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["submit", "finish", "advance"]), st.integers(0, 3), st.floats(0.0, 0.5)),
        max_size=60,
    ),
    st.integers(1, 3),
)
def test_holds_keep_every_invariant_and_every_request_ends(
    steps: list[tuple[str, int, float]], n_slots: int
) -> None:
    """Whatever arrives and ends, holds never run over the free slots' count, the
    scheduler's invariants hold, nothing waits forever, and every request ends once."""
    d = Driver(sched(n_slots, hold_s=0.25))
    n = 0
    for kind, cls, dt in steps:
        if kind == "submit":
            d.submit(req(f"r{n}", cls, d.now))
            n += 1
            d.step()
        elif kind == "finish":
            for rid in sorted(d.running):
                if rid in d.stopping:
                    d.ack(rid)
                else:
                    d.finish(rid)
                break
            d.step()
        else:
            d.advance(dt)
        holds = d.sched.holds
        # a lower class waits with a slot free only while a hold keeps that slot
        free = d.sched.free_slots
        if free and d.sched.queued and not d.stopping:
            assert holds.count > 0
    d.drain()
    assert sorted(d.ended) == sorted(d.submitted)


def test_holds_unit() -> None:
    h = Holds((frozenset({2, 3}), frozenset({3}), frozenset(), frozenset()))
    h.hold(0, 1.0)
    h.hold(1, 2.0)
    assert h.against(3) == 2 and h.against(2) == 1 and h.against(1) == 0 and h.against(0) == 0
    assert h.next_lapse() == 1.0
    h.lapse(1.0)
    assert h.count == 1 and h.against(3) == 1 and h.next_lapse() == 2.0
    h.use(1)
    assert h.count == 0 and h.next_lapse() == float("inf")
    h.use(1)  # (none left: nothing to use)
    assert h.count == 0
    h.check()


def test_freed_holds_only_for_classes_with_rights() -> None:
    h = Holds((frozenset({2, 3}), frozenset(), frozenset(), frozenset()), hold_s=0.25)
    h.freed(1, 1.0)  # (P1 here may preempt nobody: nothing to keep its slot from)
    assert h.count == 0
    h.freed(0, 1.0)
    assert h.count == 1 and h.next_lapse() == 1.25
