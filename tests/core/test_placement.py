"""How a slot placement spreads work over workers that may all take it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laneway.core import ConfigError, Dispatch, LanewayError, Request, Scheduler, SchedulerConfig, WorkerSpec
from laneway.core.prefix_cache import BLOCK_TOKENS, DEFAULT_KV_TOKENS, PrefixIndex

from .helpers import Driver, req


def two_engines(placement: str = "least-loaded", slots: int = 4) -> Driver:
    cfg = SchedulerConfig(placement=placement)
    return Driver(Scheduler([WorkerSpec("a", slots), WorkerSpec("b", slots)], cfg))


def placed(d: Driver, *rids: str) -> list[str]:
    for rid in rids:
        d.submit(req(rid, 2, d.now))
    return [x.worker_id for x in d.step() if isinstance(x, Dispatch)]


def test_least_loaded_spreads_over_engines_of_several_slots() -> None:
    """Two engines of 4 slots and 4 requests run 2 and 2, not 4 and none (found: the
    worker idle longest took every request while it had a free slot)."""
    d = two_engines()
    assert placed(d, "r0", "r1", "r2", "r3") == ["a", "b", "a", "b"]


def test_least_loaded_sends_work_where_a_slot_came_free() -> None:
    d = two_engines()
    assert placed(d, "r0", "r1", "r2", "r3") == ["a", "b", "a", "b"]
    d.finish("r1")  # b now runs 1 of 4, a 2 of 4
    assert placed(d, "r4") == ["b"]
    d.finish("r0")
    d.finish("r2")  # a runs none
    assert placed(d, "r5", "r6") == ["a", "a"]  # (then a and b run 1 and 2: a again)


@pytest.mark.parametrize("placement", ["least-loaded", "prefix"])
def test_one_request_at_a_time_goes_to_the_worker_idle_longest(placement: str) -> None:
    """Found failing: with several slots each, requests one after another all went to the
    first worker (the order of equals changed only when a worker filled up)."""
    d = two_engines(placement)
    got = []
    for i in range(6):
        got += placed(d, f"r{i}")
        d.finish(f"r{i}")
    assert got == ["a", "b", "a", "b", "a", "b"]


def test_least_loaded_weighs_the_share_of_slots() -> None:
    """A worker of 8 slots running 2 is less loaded than one of 2 running 1."""
    d = Driver(Scheduler([WorkerSpec("small", 2), WorkerSpec("big", 8)]))
    assert placed(d, "r0", "r1") == ["small", "big"]
    assert placed(d, "r2", "r3") == ["big", "big"]  # big at 1/8 and 2/8, small at 1/2


def test_round_robin_goes_in_turn_whatever_the_workers_run() -> None:
    d = two_engines("round-robin")
    assert placed(d, "r0", "r1", "r2") == ["a", "b", "a"]
    d.finish("r0")
    d.finish("r2")  # a runs nothing, b one: still b's turn
    assert placed(d, "r3", "r4") == ["b", "a"]


def test_round_robin_skips_a_full_or_failed_worker() -> None:
    d = two_engines("round-robin", slots=1)
    assert placed(d, "r0", "r1") == ["a", "b"]
    d.finish("r1")
    assert placed(d, "r2") == ["b"]  # a's turn, but a is full
    d.finish("r0")
    d.finish("r2")
    d.sched.set_available("a", False)
    assert placed(d, "r3") == ["b"]
    d.finish("r3")
    d.sched.set_available("a", True)
    assert placed(d, "r4", "r5") == ["a", "b"]


def test_an_unknown_placement_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="placement: must be one of prefix, least-loaded, round-robin"):
        SchedulerConfig(placement="random")


# ---------------------------------------------------------------------- prefix affinity
AGENT = (11, 12, 13, 14)  # an agent's system prompt: 4 blocks
OTHER = (21, 22, 23, 24)


def with_prefix(rid: str, prefix: tuple[int, ...], priority: int = 2) -> Request:
    return Request(rid, priority, 0.0, prefix=prefix)


def test_a_prompt_goes_where_it_is_cached() -> None:
    d = two_engines("prefix")
    d.submit(with_prefix("r0", AGENT))
    d.submit(with_prefix("r1", OTHER))
    assert [x.worker_id for x in d.step() if isinstance(x, Dispatch)] == ["a", "b"]
    # a runs r0 (1 of 4), b runs r1: the agent's next turn goes to a, the other's to b
    d.submit(with_prefix("r2", (*OTHER, 25)))
    d.submit(with_prefix("r3", (*AGENT, 15)))
    assert [x.worker_id for x in d.step() if isinstance(x, Dispatch)] == ["b", "a"]
    index = d.sched.placement.index  # type: ignore[attr-defined]
    assert index.matched("a", (*AGENT, 15)) == 5 and index.matched("b", AGENT) == 0


def test_a_worker_whose_cache_is_lost_is_expected_to_hold_nothing() -> None:
    d = two_engines("prefix")
    d.submit(with_prefix("r0", AGENT))
    d.submit(with_prefix("r1", OTHER))
    assert [x.worker_id for x in d.step() if isinstance(x, Dispatch)] == ["a", "b"]
    d.finish("r0")
    d.finish("r1")
    d.sched.cache_lost("a")  # its engine restarted
    index = d.sched.placement.index  # type: ignore[attr-defined]
    assert index.matched("a", AGENT) == 0 and index.matched("b", OTHER) == 4
    with pytest.raises(LanewayError, match="unknown worker"):
        d.sched.cache_lost("nobody")


def test_affinity_gives_way_to_a_much_less_loaded_worker() -> None:
    """The worker holding the prompt may run up to half its slots more than the least
    loaded one; past that an interactive request goes where it starts soonest."""
    d = two_engines("prefix")
    for i in range(3):
        d.submit(with_prefix(f"a{i}", AGENT, priority=1))
    assert [x.worker_id for x in d.step() if isinstance(x, Dispatch)] == ["a", "a", "a"]
    d.submit(with_prefix("late", AGENT, priority=1))  # a runs 3, b none: 3 more than b, over 4 // 2
    assert [x.worker_id for x in d.step() if isinstance(x, Dispatch)] == ["b"]


def test_batch_work_goes_where_its_prompt_is_while_that_worker_has_a_slot() -> None:
    """Throughput-bound (a preemptible class) weighs affinity more: the saved prefill is
    worth a busier engine, as long as it has a free slot."""
    d = two_engines("prefix")
    for i in range(3):
        d.submit(with_prefix(f"a{i}", AGENT, priority=3))
    assert [x.worker_id for x in d.step() if isinstance(x, Dispatch)] == ["a"] * 3

    def placed(r: Request) -> list[str]:
        d.submit(r)
        return [x.worker_id for x in d.step() if isinstance(x, Dispatch)]

    # a runs 3, b none: a request that may not be preempted is not patient
    assert placed(Request("kept", 3, 0.0, prefix=AGENT, preemptible=False)) == ["b"]
    d.finish("kept")
    assert placed(with_prefix("a3", AGENT, priority=3)) == ["a"]  # batch work: where its prompt is
    assert placed(with_prefix("full", AGENT, priority=3)) == ["b"]  # a has no slot left: b at once


def test_less_than_half_cached_is_placed_by_load() -> None:
    d = two_engines("prefix")
    d.submit(with_prefix("r0", AGENT))
    d.step()
    d.submit(with_prefix("r1", (11, 99, 98, 97)))  # 1 block of 4 on a
    assert [x.worker_id for x in d.step() if isinstance(x, Dispatch)] == ["b"]


def test_the_index_evicts_the_least_recently_used_blocks() -> None:
    index = PrefixIndex({"a": 4 * BLOCK_TOKENS})
    index.record("a", AGENT)
    assert index.matched("a", AGENT) == 4
    index.record("a", (11, 12))  # the agent's first blocks used again
    index.record("a", (31, 32))  # 6 blocks for 4: the oldest two (13, 14) go
    assert index.held("a") == 4
    assert index.matched("a", AGENT) == 2 and index.matched("a", (31, 32)) == 2
    index.forget("a")
    assert index.matched("a", AGENT) == 0


def test_a_worker_of_declared_kv_space_holds_that_many_blocks() -> None:
    sched = Scheduler([WorkerSpec("a", 4, kv_tokens=10 * BLOCK_TOKENS), WorkerSpec("b", 4)])
    index = sched.placement.index  # type: ignore[attr-defined]
    assert index.capacity("a") == 10 and index.capacity("b") == DEFAULT_KV_TOKENS // BLOCK_TOKENS
    with pytest.raises(ConfigError, match="kv_tokens: must be >= 1"):
        WorkerSpec("c", 1, kv_tokens=0)


_P = st.sampled_from([(), AGENT, OTHER, (*AGENT, 15), (11, 99)])


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=2, max_size=3),
    events=st.lists(st.tuples(st.sampled_from(["P0", "P3", "end"]), _P), max_size=60),
    policy=st.sampled_from(["fifo", "priority"]),
)
def test_affinity_never_overfills_a_worker_nor_delays_a_request_while_a_slot_is_free(
    sizes: list[int], events: list[tuple[str, tuple[int, ...]]], policy: str
) -> None:
    workers = [WorkerSpec(f"w{i}", n) for i, n in enumerate(sizes)]
    d = Driver(Scheduler(workers, SchedulerConfig(placement="prefix"), policy))
    for i, (kind, prefix) in enumerate(events):
        if kind == "end":
            if d.running:
                d.finish(sorted(d.running)[i % len(d.running)])
        else:
            d.submit(Request(f"r{i}", 0 if kind == "P0" else 3, d.now, prefix=prefix))
        d.step()
        for w in d.sched.workers.values():
            assert len(w.running) <= w.spec.slots
        if d.sched.queued:
            assert d.sched.free_slots == 0, "a request waits while a slot is free"
        d.now += 0.1


# ---------------------------------------------------------------------- concurrency caps
def test_a_cap_withholds_free_slots_at_once_and_running_ones_as_they_end() -> None:
    d = two_engines()
    assert placed(d, "r0", "r1", "r2") == ["a", "b", "a"]  # a runs 2, b 1
    d.sched.set_slots("a", 1)  # a saturated: one at most, nothing stopped
    assert placed(d, "r3", "r4", "r5", "r6") == ["b", "b", "b"]  # a's free slots withheld
    assert d.sched.queued == 1 and d.sched.get("r0").state.value == "running"
    d.finish("r0")  # a runs 1 now: the slot r0 leaves is withheld too
    assert d.step() == []
    d.finish("r2")  # a runs none: one slot again
    assert placed(d) == ["a"]
    d.sched.set_slots("a", 4)  # drained: all of them again
    d.sched.check_invariants()
    assert d.sched.workers["a"].free == 3


def test_a_cap_is_one_to_all_the_slots() -> None:
    sched = Scheduler([WorkerSpec("a", 4)])
    for bad in (0, 5):
        with pytest.raises(LanewayError, match="is not 1 to 4"):
            sched.set_slots("a", bad)


@settings(max_examples=150, deadline=None)
@given(
    caps=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 4)), max_size=12),
    events=st.lists(st.sampled_from(["P0", "P3", "end"]), max_size=50),
)
def test_a_worker_never_runs_more_than_its_cap_once_it_drained(
    caps: list[tuple[int, int]], events: list[str]
) -> None:
    d = Driver(Scheduler([WorkerSpec("a", 4), WorkerSpec("b", 2)], SchedulerConfig(), "priority"))
    cap = {"a": 4, "b": 2}
    for i, kind in enumerate(events):
        for at, n in caps:
            if at == i:
                w = "a" if n % 2 else "b"
                n = min(n, 4 if w == "a" else 2)
                d.sched.set_slots(w, n)
                cap[w] = n
        if kind == "end":
            if d.running:
                d.finish(sorted(d.running)[i % len(d.running)])
        else:
            d.submit(Request(f"r{i}", 0 if kind == "P0" else 3, d.now))
        before = {w: len(s.running) for w, s in d.sched.workers.items()}
        d.step()
        d.sched.check_invariants()
        for w, s in d.sched.workers.items():  # nothing started over a cap (what ran before stays)
            assert len(s.running) <= max(cap[w], before[w])
        d.now += 0.1


def test_a_slot_freed_by_a_preemption_goes_to_its_claimant_under_a_cap() -> None:
    d = Driver(Scheduler([WorkerSpec("a", 2)]))
    assert placed(d, "b0", "b1") == ["a", "a"]
    d.now = 1.0
    d.sched.set_slots("a", 1)  # (both keep running: the cap takes the next slot that ends)
    d.submit(Request("urgent", 0, d.now))
    out = d.step()
    assert [type(x).__name__ for x in out] == ["Preempt"]
    d.ack(out[0].request_id)
    assert [x.request_id for x in d.step() if isinstance(x, Dispatch)] == ["urgent"]
    d.sched.check_invariants()


def _chain(path: tuple[int, ...]) -> tuple[int, ...]:
    """A chain of block hashes: each block's hash names every block before it."""
    return tuple(hash(path[: i + 1]) for i in range(len(path)))


_PATHS = st.lists(st.integers(0, 2), min_size=0, max_size=12).map(tuple)


@settings(max_examples=200, deadline=None)
@given(capacity=st.integers(1, 24), sent=st.lists(_PATHS, max_size=30), asked=st.lists(_PATHS, max_size=10))
def test_a_match_is_the_leading_blocks_held(
    capacity: int, sent: list[tuple[int, ...]], asked: list[tuple[int, ...]]
) -> None:
    """What a worker holds of any chain is a leading part of it, whatever was evicted: the
    binary search finds as many blocks as a walk from the head would."""
    index = PrefixIndex({"a": capacity * BLOCK_TOKENS})
    for path in sent:
        index.record("a", _chain(path))
        assert index.held("a") <= capacity
    held = index._blocks["a"]
    for path in [*asked, *sent]:
        chain = _chain(path)
        walked = next((i for i, b in enumerate(chain) if b not in held), len(chain))
        assert index.matched("a", chain) == walked
        assert all(b not in held for b in chain[walked:])  # held blocks of a chain lead it
