"""Upstreams with prefix caches in the simulator: the engines' caches and prefill, the
agents scenario, and the spread baselines beside laneway's placement."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from laneway.cli import main
from laneway.core import WorkerSpec
from laneway.core.prefix_cache import BLOCK_TOKENS
from laneway.sim.engines import Engines
from laneway.sim.report import summarize
from laneway.sim.scenarios import Scenario, agents
from laneway.sim.simulation import simulate


def test_an_engine_prefills_only_what_it_does_not_hold_one_prompt_at_a_time() -> None:
    engines = Engines([WorkerSpec("a", 4, kv_tokens=100 * BLOCK_TOKENS), WorkerSpec("b", 4)], 3200.0)
    system = tuple(range(1, 11))  # 10 blocks: 320 tokens, 0.1 s of prefill
    first, cached = engines.start("a", system, 320, now=0.0)
    assert (first, cached) == (pytest.approx(0.1), 0)
    # a second prompt at once waits for the first's prefill, then prefills its own
    first, cached = engines.start("a", (*system, 11), 352, now=0.0)
    assert cached == 320 and first == pytest.approx(0.1 + 32 / 3200)
    # the other engine holds nothing of it
    assert engines.start("b", system, 320, now=0.0) == (pytest.approx(0.1), 0)
    # a reply is held once the request ended: the next turn finds it
    engines.finished("a", (*system, 11), (12, 13))
    first, cached = engines.start("a", (*system, 11, 12, 13, 14), 14 * BLOCK_TOKENS, now=5.0)
    assert cached == 13 * BLOCK_TOKENS and first == pytest.approx(32 / 3200)
    assert engines.hit_rate() == pytest.approx((320 + 13 * 32) / (320 + 352 + 320 + 14 * 32))


def test_an_engine_evicts_past_its_kv_space() -> None:
    engines = Engines([WorkerSpec("a", 1, kv_tokens=4 * BLOCK_TOKENS)], 1000.0)
    engines.start("a", (1, 2, 3), 96, now=0.0)
    engines.start("a", (7, 8, 9), 96, now=1.0)  # 6 blocks for 4: the first prompt's tail goes
    assert engines.start("a", (1, 2, 3), 96, now=2.0)[1] == 1 * BLOCK_TOKENS


def test_a_request_stopped_before_its_first_token_gives_its_engine_back_its_prefill() -> None:
    engines = Engines([WorkerSpec("a", 4)], 1000.0)
    system = tuple(range(1, 64))  # 2,016 tokens
    assert engines.start("a", system, 2000, now=0.0, rid="long")[0] == pytest.approx(2.0)
    assert engines.start("a", (99,), 500, now=0.5, rid="next")[0] == pytest.approx(2.0)  # 2.0 → 2.5
    # "long" stopped at 1 s: "next" begins then, not at 2 s
    assert engines.give_back("a", "long", 1.0) == {"next": pytest.approx(1.0)}
    assert engines.start("a", (98,), 100, now=1.2, rid="after")[0] == pytest.approx(0.3 + 0.1)
    assert engines.give_back("a", "next", 2.0) == {}  # (its prefill was done)
    assert engines.give_back("a", "nobody", 2.0) == {}
    # of its prompt the engine holds what was prefilled (1,000 tokens: 31 blocks), no more
    assert engines.start("a", system, 2000, now=3.0, rid="again")[1] == 31 * BLOCK_TOKENS


def test_a_p1_that_preempts_a_p3_in_its_prefill_does_not_wait_for_that_prefill() -> None:
    from laneway.sim.workload import SimRequest

    # one slot; a P3 of 16,000 tokens (2 s of prefill at 8,000 tokens/s), a P1 at 0.5 s
    reqs = [
        SimRequest("p3", 0.0, 3, 1.0, prompt_tokens=16_000, prefix=tuple(range(1, 501))),
        SimRequest("p1", 0.5, 1, 1.0, prompt_tokens=800, prefix=tuple(range(1000, 1025))),
    ]
    result = simulate(reqs, slots=1, workers=[WorkerSpec("u0", 1)], caches=True, check=True)
    p3, p1 = result.outcomes
    assert p3.status == p1.status == "finished" and p3.req.preemptions == 1
    # its own prefill (0.1 s) after the stop: not after the rest of the P3's (1.5 s more)
    assert p1.ttft_s < 0.5, p1.ttft_s
    assert p3.ttft_s > p1.ttft_s + 0.5 + 2.0 - 0.5  # (the P3 prefilled again after the P1)


def small_agents(policy: str) -> dict[str, object]:
    sc = agents(seed=3, upstreams=4, count=80, kv_tokens=32_768)
    assert sc.workers is not None and sc.caches
    result = simulate(sc.requests, slots=sc.slots, policy=policy, workers=sc.workers, caches=True, check=True)
    ended = [o for o in result.outcomes if o.status == "finished"]
    assert len(ended) == len(sc.requests) == len({o.spec.id for o in ended})  # each ends once
    assert all(not math.isnan(o.ttft_s) and o.ttft_s >= o.first_wait_s for o in ended)
    return summarize(result)


def test_prefix_placement_finds_the_agents_prompts_where_round_robin_does_not() -> None:
    got = {p: small_agents(p) for p in ("laneway", "round-robin", "least-loaded")}
    hit = {p: s["prefix"]["hit_rate"] for p, s in got.items()}  # type: ignore[index]
    ttft = {p: s["prefix"]["ttft"]["P1"]["p50_s"] for p, s in got.items()}  # type: ignore[index]
    assert hit["laneway"] > 2 * hit["round-robin"] and hit["laneway"] > 2 * hit["least-loaded"], hit
    assert ttft["laneway"] < ttft["round-robin"] / 2 and ttft["laneway"] < ttft["least-loaded"] / 2, ttft
    # the flood (P3) is done as soon under laneway as under the baselines, give or take
    flood = {p: s["classes"]["P3"]["makespan_s"] for p, s in got.items()}  # type: ignore[index]
    assert flood["laneway"] <= 1.1 * min(flood["round-robin"], flood["least-loaded"]), flood


def test_the_agents_scenario_is_its_own_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--scenario", "agents", "--slots", "8"]) == 2
    assert "scenario agents runs on its own upstreams" in capsys.readouterr().err


def test_all_policies_on_upstreams_with_caches_include_the_spread_baselines() -> None:
    from laneway.cli import parse_policies, run_policies
    from laneway.sim.tables import render_prefix

    assert {"round-robin", "least-loaded"} <= set(parse_policies("all", caches=True))
    assert not {"round-robin", "least-loaded", "naive"} & set(parse_policies("all"))
    sc = agents(seed=1, upstreams=2, count=10, kv_tokens=16_384)
    results = run_policies(["laneway", "round-robin"], sc, 1)
    summaries = [summarize(r) for r in results]
    assert [s["slots"] for s in summaries] == [16, 16]
    assert all(0 < s["prefix"]["hit_rate"] < 1 for s in summaries)
    table = render_prefix(summaries)
    assert table is not None and table.row_count == 4  # P1 and P3 of both policies
    assert render_prefix([summarize(simulate(sc.requests[:5], slots=2))]) is None  # plain slots


def test_the_report_of_upstreams_with_caches_has_their_time_to_first_token() -> None:
    from laneway.sim.plots import summary_markdown

    sc = agents(seed=2, upstreams=2, count=8, kv_tokens=16_384)
    s = summarize(simulate(sc.requests, slots=sc.slots, workers=sc.workers, caches=True))
    md = summary_markdown([s])
    assert "## Upstreams with prefix caches: time to first token" in md
    p1 = s["prefix"]["ttft"]["P1"]
    assert f"| laneway | {s['prefix']['hit_rate']:.1%} | P1 | {p1['count']} |" in md


def test_a_trace_of_prefixes_on_upstreams_runs_as_the_scenario_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The agents scenario written as a trace (its lines' prefix and reply) and replayed on
    as many upstreams: the same figures as the scenario itself."""
    from laneway.core import ClassTable
    from laneway.sim.workload import to_jsonl

    sc = agents(seed=4, upstreams=2, count=10, kv_tokens=16_384)
    trace = tmp_path / "agents.jsonl"
    trace.write_text(to_jsonl(sc.requests, ClassTable()))
    argv = ["simulate", "--trace", str(trace), "--upstreams", "2", "--kv-tokens", "16384", "--json"]
    assert main([*argv, "--policy", "laneway,round-robin"]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    want = [
        summarize(simulate(sc.requests, slots=16, policy=p, workers=sc.workers, caches=True))
        for p in ("laneway", "round-robin")
    ]
    for g, w in zip(got, want, strict=True):  # (the trace keeps arrivals to the microsecond)
        assert g["prefix"]["hit_rate"] == pytest.approx(w["prefix"]["hit_rate"], rel=1e-3)
        assert g["prefix"]["ttft"]["P1"]["p50_s"] == pytest.approx(
            w["prefix"]["ttft"]["P1"]["p50_s"], rel=1e-3
        )
    assert got[0]["prefix"]["hit_rate"] > got[1]["prefix"]["hit_rate"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scenario", "agents", "--upstreams", "4"], "argument --upstreams: only with --trace"),
        (["--trace", "T", "--kv-tokens", "9"], "argument --kv-tokens: only with --upstreams"),
        (["--trace", "T", "--upstreams", "2", "--fleet", "F"], "argument --upstreams: not with --fleet"),
        (["--scenario", "chat-vs-batch", "--isolate"], "argument --isolate: only on upstreams"),
    ],
)
def test_upstreams_go_with_a_trace_only(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_a_bad_prefix_in_a_trace_names_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text(
        '{"arrival_s": 0, "priority": 1, "duration_s": 1, "prefix": [1, 2]}\n'
        '{"arrival_s": 1, "priority": 1, "duration_s": 1, "prefix": [1, "two"]}\n'
    )
    assert main(["simulate", "--trace", str(trace), "--upstreams", "2"]) == 2
    err = capsys.readouterr().err
    assert f"{trace}:2: field 'prefix' must be a list of whole numbers >= 0 (block hashes)" in err, err


def test_a_given_duration_is_generation_and_the_engine_adds_its_prefill() -> None:
    from laneway.sim.workload import SimRequest

    prefix = tuple(range(1, 251))  # 8,000 tokens: 1 s of prefill at the default 8,000 tokens/s
    reqs = [SimRequest(f"r{i}", 10.0 * i, 1, 2.0, prompt_tokens=8000, prefix=prefix) for i in range(2)]
    workers = [WorkerSpec("u0", 2, kv_tokens=16_384)]
    result = simulate(reqs, slots=2, workers=workers, caches=True)
    first, second = result.outcomes
    assert first.latency_s == pytest.approx(3.0) and first.ttft_s == pytest.approx(1.0)
    assert second.latency_s == pytest.approx(2.0) and second.cached_tokens == 8000


def agents_trace(tmp_path: Path, count: int) -> tuple[Scenario, list[str]]:
    """The agents scenario on 2 upstreams written as a trace, and the ``simulate`` command
    line that runs it on upstreams of 16,384 tokens of KV each (JSON out)."""
    from laneway.core import ClassTable
    from laneway.sim.workload import to_jsonl

    sc = agents(seed=4, upstreams=2, count=count, kv_tokens=16_384)
    trace = tmp_path / "agents.jsonl"
    trace.write_text(to_jsonl(sc.requests, ClassTable()))
    return sc, ["simulate", "--trace", str(trace), "--upstreams", "2", "--kv-tokens", "16384", "--json"]


def test_a_trace_on_isolated_upstreams_runs_urgent_work_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--isolate``: the upstreams run urgent work alone (a worker's ``isolate``), as the
    server's do: an agent's turn stops the batch work beside it."""
    sc, argv = agents_trace(tmp_path, count=10)
    assert main(argv) == 0
    assert main([*argv, "--isolate"]) == 0
    shared, alone = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert main([*argv, "--isolate", "--policy", "fifo"]) == 0  # (one queue: nothing to keep apart)
    assert "isolate does nothing under policy fifo" in capsys.readouterr().err
    assert alone["preemptions"] > shared["preemptions"]  # (each turn stops what runs beside it)
    from dataclasses import replace

    assert sc.workers is not None
    isolated = [replace(w, isolate=True) for w in sc.workers]
    want = summarize(simulate(sc.requests, slots=16, workers=isolated, caches=True))
    assert alone["preemptions"] == want["preemptions"]
    assert alone["prefix"]["hit_rate"] == pytest.approx(want["prefix"]["hit_rate"], rel=1e-3)


def test_the_prefill_guard_can_be_turned_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--no-prefill-guard``: an urgent long prefill may run beside others, as with the
    server's ``[scheduler] prefill_guard = false``; by default it guards its upstream."""
    from laneway.core import SchedulerConfig

    sc, argv = agents_trace(tmp_path, count=40)
    assert main(argv) == 0
    assert main([*argv, "--no-prefill-guard"]) == 0
    guarded, unguarded = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    for got, on in ((guarded, True), (unguarded, False)):
        config = SchedulerConfig(prefill_guard=on)
        want = summarize(simulate(sc.requests, slots=16, workers=sc.workers, caches=True, config=config))
        assert got["preemptions"] == want["preemptions"], on
    assert guarded["preemptions"] != unguarded["preemptions"]  # (its stops of batch prefills)


def p3_wait_over_estimate(isolate: bool) -> float:
    """The median of the agents' flood (P3) wait over its estimate on arrival (those that
    waited at least 1 s), on 8 upstreams, isolated or not."""
    import statistics
    from dataclasses import replace

    sc = agents(seed=3, upstreams=8, count=300)
    assert sc.workers is not None
    workers = [replace(w, isolate=isolate) for w in sc.workers]
    result = simulate(sc.requests, slots=sc.slots, workers=workers, caches=True)
    ratios = [
        o.first_wait_s / o.estimate_s
        for o in result.outcomes
        if o.spec.priority == 3 and o.status == "finished" and o.first_wait_s >= 1.0 and o.estimate_s > 0
    ]
    assert len(ratios) > 100
    return statistics.median(ratios)


def test_batch_works_estimate_counts_the_slots_urgent_work_kept_from_it_on_isolated_upstreams() -> None:
    """On isolated upstreams urgent work keeps batch work off a whole worker while it runs
    there: the queue ahead of a batch request drains at the slots left to it lately, and
    its estimate says so (counted as urgent work's share of the slots, as on shared
    upstreams, it was 3.9 times too short here)."""
    shared, alone = p3_wait_over_estimate(False), p3_wait_over_estimate(True)
    assert 0.5 < shared < 1.5, shared
    assert 0.5 < alone < 2.0, alone
