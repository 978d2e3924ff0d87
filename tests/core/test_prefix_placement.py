"""Placement by prefix: where a prompt is likely cached, weighed against load; urgent work
stopping batch work for its cache; the prefix index's leading-block match."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laneway.core import (
    ConfigError,
    Dispatch,
    LanewayError,
    Preempt,
    Request,
    Scheduler,
    SchedulerConfig,
    WorkerSpec,
)
from laneway.core.affinity import STOP_WAIT_S
from laneway.core.prefix_cache import BLOCK_TOKENS, DEFAULT_KV_TOKENS, PrefixIndex

from .helpers import Driver, two_engines

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


def _turn(rid: str, prompt: tuple[int, ...], tokens: int | None = None) -> Request:
    """An agent's turn (P1) whose prompt is these blocks (``tokens`` tokens: by default
    its blocks, no more)."""
    tokens = len(prompt) * BLOCK_TOKENS if tokens is None else tokens
    return Request(rid, 1, 0.0, prompt_tokens=tokens, prefix=prompt)


def _turns_on_a(d: Driver, prompt: tuple[int, ...], n: int) -> None:
    """``n`` turns of one agent, one after another: each on ``a``, past its prefill."""
    for i in range(n):
        d.submit(_turn(f"t{i}", prompt))
        assert [x.worker_id for x in d.step() if isinstance(x, Dispatch)] == ["a"]
        d.sched.first_token(f"t{i}", d.now)


def test_affinity_weighs_the_prefill_it_saves_against_the_requests_it_runs_beside() -> None:
    """The worker holding the prompt runs 3 requests, the other none: a long prompt's next
    turn still goes where it is cached (its 1,280 tokens to prefill elsewhere weigh as 5
    running requests), a short one's to the idle worker (128 tokens weigh half of one).
    Found with two vLLMs and 1,337-token prompts: a turn sent to the idle engine paid its
    whole prefill (~5 s) where beside 3 decoding requests it had its first token in ~0.3 s."""
    long_prompt = tuple(range(100, 140))  # 40 blocks: 1,280 tokens
    d = two_engines("prefix")
    _turns_on_a(d, long_prompt, 3)
    d.submit(_turn("next", (*long_prompt, 999)))
    assert [x.worker_id for x in d.step() if isinstance(x, Dispatch)] == ["a"]

    d = two_engines("prefix")
    _turns_on_a(d, AGENT, 1)  # 1 vs none: 1 + 0 against 128 / 256 tokens of prefill
    d.submit(_turn("next", AGENT))
    assert [x.worker_id for x in d.step() if isinstance(x, Dispatch)] == ["b"]

    # the edge: a runs 3, b none; a prompt of 768 tokens saves 3 running requests' worth
    # (a tie goes where it is cached), one of 640 tokens 2.5 (it goes to b)
    for blocks, went in ((24, "a"), (20, "b")):
        d = two_engines("prefix")
        prompt = tuple(range(200, 200 + blocks))
        _turns_on_a(d, prompt, 3)
        d.submit(_turn("next", prompt))
        assert [x.worker_id for x in d.step() if isinstance(x, Dispatch)] == [went]


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


def _new_agent(rid: str, first_block: int, tokens: int = 1_300) -> Request:
    """A first turn: a prompt of ``tokens`` no engine holds (its own blocks)."""
    return _turn(rid, tuple(range(first_block, first_block + tokens // BLOCK_TOKENS)), tokens)


def test_two_new_prompts_at_once_go_to_two_engines_not_both_to_the_idle_one() -> None:
    """Found with two real vLLMs: two requests ended together on one engine, their agents
    sent their next at once, and both went to that engine (it ran none, the other two),
    where their two 1,337-token prefills shared one core (each ~13 s to its first token,
    6.7 s alone). A prompt still to be prefilled weighs more than a decoding request."""
    d = two_engines("prefix")
    d.submit(_new_agent("x0", 1000))
    d.submit(_new_agent("x1", 2000))
    assert [x.worker_id for x in d.step() if isinstance(x, Dispatch)] == ["a", "b"]
    for rid in ("x0", "x1"):
        d.sched.first_token(rid, d.now)
    d.submit(_new_agent("y0", 3000))
    d.submit(_new_agent("y1", 4000))
    assert [x.worker_id for x in d.step() if isinstance(x, Dispatch)] == ["a", "b"]
    for rid in ("y0", "y1"):
        d.sched.first_token(rid, d.now)
    d.finish("x1")
    d.finish("y1")  # b runs none, a two that decode
    d.submit(_new_agent("z0", 5000))
    d.submit(_new_agent("z1", 6000))
    # (by the count alone both would go to b: it would run 1 of 4 where a runs 2)
    assert [x.worker_id for x in d.step() if isinstance(x, Dispatch)] == ["b", "a"]
    assert d.sched.workers["b"].prefill == 1_300 and d.sched.workers["a"].prefill == 1_300


def test_a_prefill_counts_until_its_first_token_or_its_end_and_only_its_uncached_part() -> None:
    d = two_engines("prefix")
    d.submit(_new_agent("x0", 1000))
    d.step()
    a = d.sched.workers["a"]
    assert a.prefill == 1_300
    d.sched.first_token("x0", d.now)
    d.sched.first_token("x0", d.now)  # (once is enough)
    assert a.prefill == 0
    d.finish("x0")
    # its next turn: the 40 blocks held, 20 tokens past them to prefill
    d.submit(Request("x1", 1, 0.0, prompt_tokens=1_300, prefix=tuple(range(1000, 1041))))
    d.step()
    assert a.prefill == 1_300 - 40 * BLOCK_TOKENS
    d.finish("x1")  # (ended before its first token: cancelled, say)
    assert a.prefill == 0
    # a request stopped before its first token prefills again where it resumes
    d2 = Driver(Scheduler([WorkerSpec("a", 1)], SchedulerConfig(placement="prefix"), "laneway"))
    d2.submit(Request("batch", 3, 0.0, prompt_tokens=640, prefix=tuple(range(20)), est_service_s=60.0))
    d2.step()
    d2.submit(Request("urgent", 0, 0.0, prompt_tokens=64, prefix=(900, 901)))
    assert [x.request_id for x in d2.step() if isinstance(x, Preempt)] == ["batch"]
    d2.ack("batch")
    d2.step()
    assert d2.running == {"urgent": "a"} and d2.sched.workers["a"].prefill == 64
    d2.sched.first_token("urgent", d2.now)
    d2.finish("urgent")
    d2.step()  # batch resumes: its blocks are held there now
    assert d2.sched.workers["a"].prefill == 0 and d2.running == {"batch": "a"}


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


def test_a_refused_prompt_leaves_nothing_in_the_index_and_one_past_the_cache_is_not_recorded() -> None:
    """(an engine refusing over-long prompts kept laneway's index of it full of them: every
    agent's next turn went elsewhere.) A prompt the engine refused before prefilling it
    (``prompt_tokens=0``) leaves only what was held before; one longer than the engine's
    KV space is not recorded at all, so it pushes no other prompt out."""
    sched = Scheduler([WorkerSpec("a", 4, kv_tokens=8 * BLOCK_TOKENS)])
    index = sched.placement.index  # type: ignore[attr-defined]
    sched.submit(with_prefix("r0", AGENT), 0.0)
    sched.schedule(0.0)
    sched.finished("r0", 1.0)
    sched.submit(with_prefix("bad", (*AGENT, 41, 42)), 1.0)  # its head held, its tail new
    sched.schedule(1.0)
    assert index.matched("a", (*AGENT, 41, 42)) == 6
    sched.finished("bad", 2.0, failed=True, prompt_tokens=0)
    assert index.matched("a", (*AGENT, 41, 42)) == 4 and index.held("a") == 4
    sched.submit(with_prefix("huge", tuple(range(100, 109))), 2.0)  # 9 blocks of 8
    sched.schedule(2.0)
    assert index.held("a") == 4 and index.matched("a", AGENT) == 4
    sched.finished("huge", 3.0)  # (ended: nothing to take back either way)
    assert index.matched("a", AGENT) == 4


def test_a_worker_of_declared_kv_space_holds_that_many_blocks() -> None:
    sched = Scheduler([WorkerSpec("a", 4, kv_tokens=10 * BLOCK_TOKENS), WorkerSpec("b", 4)])
    index = sched.placement.index  # type: ignore[attr-defined]
    assert index.capacity("a") == 10 and index.capacity("b") == DEFAULT_KV_TOKENS // BLOCK_TOKENS
    with pytest.raises(ConfigError, match="kv_tokens: must be >= 1"):
        WorkerSpec("c", 1, kv_tokens=0)


def test_urgent_work_frees_a_slot_where_its_prompt_is_cached() -> None:
    """Every slot runs batch work: an agent's next turn stops the batch request on the
    worker holding its prompt, not the one stopped by the usual order (the latest to
    arrive), so that it starts there and skips the prefill. Found: agents' turns went
    wherever a victim happened to run, both engines came to hold every agent's prompt,
    and under a batch flood their prefix hits fell from ~50 % to 19-41 % (laneway's own
    index expected 23-48 %)."""
    d = Driver(Scheduler([WorkerSpec("a", 1), WorkerSpec("b", 1)], SchedulerConfig(placement="prefix")))
    d.submit(with_prefix("turn1", AGENT, priority=0))
    assert [x.worker_id for x in d.step() if isinstance(x, Dispatch)] == ["a"]
    d.finish("turn1")
    # batch work (long: stopped at once rather than drained), where its prompt is: a; then
    # the latest to arrive: b
    d.submit(Request("x", 3, 0.0, prefix=AGENT, est_service_s=60.0))
    d.submit(Request("y", 3, 0.0, prefix=OTHER, est_service_s=60.0))
    assert [x.worker_id for x in d.step() if isinstance(x, Dispatch)] == ["a", "b"]
    d.submit(with_prefix("turn2", (*AGENT, 15), priority=0))
    stops = [x for x in d.step() if isinstance(x, Preempt)]
    assert [(x.request_id, x.worker_id) for x in stops] == [("x", "a")]
    d.ack("x")
    assert [(x.request_id, x.worker_id) for x in d.step() if isinstance(x, Dispatch)] == [("turn2", "a")]
    # a prompt cached nowhere: the usual order (the latest to arrive, y on b)
    d.submit(with_prefix("new", (41, 42), priority=0))
    assert [x.request_id for x in d.step() if isinstance(x, Preempt)] == ["y"]


def flooded(policy: str = "laneway", free_on_b: int = 1) -> Driver:
    """Workers a and b of 4 slots; an agent's prompt on a; batch work in every slot of a and
    in all but ``free_on_b`` of b's."""
    d = Driver(
        Scheduler([WorkerSpec("a", 4), WorkerSpec("b", 4)], SchedulerConfig(placement="prefix"), policy)
    )
    d.submit(with_prefix("turn1", AGENT, priority=0))
    assert [x.worker_id for x in d.step() if isinstance(x, Dispatch)] == ["a"]
    d.finish("turn1")
    for i in range(4):  # (batch work goes where its prompt is: a, while it has a slot)
        d.submit(Request(f"p{i}", 3, 0.0, prefix=AGENT, est_service_s=60.0))
    for i in range(4 - free_on_b):  # (prompts of their own: b)
        d.submit(Request(f"q{i}", 3, 0.0, prefix=(100 + i,), est_service_s=60.0))
    d.step()
    assert len(d.sched.workers["a"].running) == 4 and d.sched.workers["b"].free == free_on_b
    return d


def test_urgent_work_stops_batch_work_where_its_prompt_is_rather_than_start_elsewhere() -> None:
    """Found under a batch flood over two vLLM engines: the worker holding an agent's prompt
    was full of batch work while the other had a slot, so the agent's next turn started
    there and paid its whole prefill (laneway's own index expected 22-27 % prefix hits
    against 63 % without the flood). It stops a batch request on its own worker and
    starts there once that slot is free."""
    d = flooded()
    d.submit(with_prefix("turn2", (*AGENT, 15), priority=0))
    out = d.step()
    stops = [(x.request_id, x.worker_id) for x in out if isinstance(x, Preempt)]
    assert len(stops) == 1 and stops[0][1] == "a"
    assert not [x for x in out if isinstance(x, Dispatch)]  # it waits for that slot
    assert d.step() == []  # one stop only, while it is under way
    # urgent work behind it in its queue waits for that stop too (an abort, a checkpoint)
    d.submit(with_prefix("new", (41, 42), priority=0))
    assert d.step() == []
    d.ack(stops[0][0])
    got = [(x.request_id, x.worker_id) for x in d.step() if isinstance(x, Dispatch)]
    assert got == [("turn2", "a"), ("new", "b")]  # (the batch request stopped waits now)


def test_a_stop_not_done_within_a_second_is_waited_for_no_longer() -> None:
    """A stop an engine does not answer (a hung abort) keeps the agent's turn waiting 1 s
    at most (``STOP_WAIT_S``): then it starts on the free slot, and the scheduler wakes
    for it with no other event."""
    d = flooded()
    d.submit(with_prefix("turn2", (*AGENT, 15), priority=0))
    stops = [x.request_id for x in d.step() if isinstance(x, Preempt)]
    assert len(stops) == 1
    assert d.sched.next_wakeup() == pytest.approx(STOP_WAIT_S)
    got = [(x.request_id, x.worker_id) for x in d.advance(STOP_WAIT_S + 0.01) if isinstance(x, Dispatch)]
    assert got == [("turn2", "b")]
    d.ack(stops[0])  # (its stop ends at last: its slot goes to work still waiting, the request stopped)
    assert [(x.request_id, x.worker_id) for x in d.step() if isinstance(x, Dispatch)] == [(stops[0], "a")]


def test_urgent_work_starts_on_a_much_less_loaded_worker_rather_than_stop_batch_work() -> None:
    """With a slot freed the agent's worker would run 3, b runs none: its short prompt
    (128 tokens) saves less than 3 running requests cost, so placement would not choose
    it; nothing is stopped."""
    d = flooded(free_on_b=4)
    d.submit(with_prefix("turn2", (*AGENT, 15), priority=0))
    out = d.step()
    assert not [x for x in out if isinstance(x, Preempt)]
    assert [(x.request_id, x.worker_id) for x in out if isinstance(x, Dispatch)] == [("turn2", "b")]


def test_a_stop_is_weighed_against_the_worker_placement_would_take_now() -> None:
    """The worker a turn would start on at once is the least loaded as placement ranks it
    (a prompt still prefilled there weighs as more running requests), not the one running
    the fewest: b runs 1 request still prefilling 1,300 tokens, c 2 decoding. The turn's
    384-token prompt, held on a full of batch work, would cost 3 + 0 running requests on a
    with a slot freed, 2 + 1.5 on c, where it would start (on b 1 + 1.5, where it would
    not): a batch request on a is stopped for it."""
    d = Driver(
        Scheduler(
            [WorkerSpec("a", 4), WorkerSpec("b", 4), WorkerSpec("c", 4)],
            SchedulerConfig(placement="prefix"),
            "laneway",
        )
    )
    agent = tuple(range(11, 23))  # 12 blocks: 384 tokens
    d.submit(_turn("turn1", agent))
    assert [x.worker_id for x in d.step() if isinstance(x, Dispatch)] == ["a"]
    d.finish("turn1")
    for i in range(4):  # (batch work goes where its prompt is: a, while it has a slot)
        d.submit(Request(f"p{i}", 3, 0.0, prefix=agent, est_service_s=60.0))
    long_prompt = tuple(range(300, 340))
    d.submit(Request("long", 3, 0.0, prompt_tokens=1_300, prefix=long_prompt, est_service_s=60.0))
    d.submit(Request("q0", 3, 0.0, prefix=(500,), est_service_s=60.0))
    d.submit(Request("q1", 3, 0.0, prefix=(501,), est_service_s=60.0))
    got = [(x.request_id, x.worker_id) for x in d.step() if isinstance(x, Dispatch)]
    assert got == [
        ("p0", "a"),
        ("p1", "a"),
        ("p2", "a"),
        ("p3", "a"),
        ("long", "b"),
        ("q0", "c"),
        ("q1", "c"),
    ]
    assert d.sched.workers["b"].prefill == 1_300 and d.sched.workers["c"].prefill == 0
    d.submit(Request("turn2", 0, 0.0, prompt_tokens=384, prefix=agent))  # (P0: it may stop P3)
    out = d.step()
    assert [x.worker_id for x in out if isinstance(x, Preempt)] == ["a"]
    assert not [x for x in out if isinstance(x, Dispatch)]  # (it waits for that slot)


def test_no_stop_on_a_worker_whose_cap_would_withhold_the_slot() -> None:
    """The saturation gate capped the agent's worker below what it runs: a slot a stop
    frees there is withheld, so nothing is stopped and the turn starts where a slot is."""
    d = flooded()
    d.sched.set_slots("a", 3)
    d.submit(with_prefix("turn2", (*AGENT, 15), priority=0))
    out = d.step()
    assert not [x for x in out if isinstance(x, Preempt)]
    assert [(x.request_id, x.worker_id) for x in out if isinstance(x, Dispatch)] == [("turn2", "b")]


@pytest.mark.parametrize("policy", ["graceful", "priority"])
def test_no_stop_for_a_cache_under_a_policy_that_does_not_stop_at_once(policy: str) -> None:
    d = flooded(policy)
    d.submit(with_prefix("turn2", (*AGENT, 15), priority=0))
    out = d.step()
    assert not [x for x in out if isinstance(x, Preempt)]
    assert [(x.request_id, x.worker_id) for x in out if isinstance(x, Dispatch)] == [("turn2", "b")]


_P = st.sampled_from([(), AGENT, OTHER, (*AGENT, 15), (11, 99)])


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=2, max_size=3),
    events=st.lists(st.tuples(st.sampled_from(["P0", "P3", "end"]), _P), max_size=60),
    policy=st.sampled_from(["fifo", "priority", "laneway"]),
)
def test_affinity_never_overfills_a_worker_nor_delays_a_request_while_a_slot_is_free(
    sizes: list[int], events: list[tuple[str, tuple[int, ...]]], policy: str
) -> None:
    """(Under ``laneway`` P0 preempts P3, the victim chosen where its prompt is cached.)"""
    workers = [WorkerSpec(f"w{i}", n) for i, n in enumerate(sizes)]
    d = Driver(Scheduler(workers, SchedulerConfig(placement="prefix"), policy))
    for i, (kind, prefix) in enumerate(events):
        if kind == "end":
            if d.running:
                d.finish(sorted(d.running)[i % len(d.running)])
        else:
            size = 60.0 if kind == "P3" else None  # (long batch work: stopped, not drained)
            d.submit(Request(f"r{i}", 0 if kind == "P0" else 3, d.now, prefix=prefix, est_service_s=size))
        d.step()
        for rid in sorted(d.stopping):  # (the worker stops what was preempted)
            d.ack(rid)
        d.step()
        for w in d.sched.workers.values():
            assert len(w.running) <= w.spec.slots
        if d.sched.queued and d.sched.free_slots:
            # (only for the stop of batch work where its prompt is: a request stopping)
            assert d.stopping, "a request waits while a slot is free"
        d.now += 0.1


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
