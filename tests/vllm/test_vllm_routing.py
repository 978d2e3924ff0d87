"""What laneway learns of a real vLLM and tells it: the saturation gate on its own gauges,
and each request's class as vLLM's priority (the session's vLLM runs 4 sequences at most,
``--scheduling-policy priority``)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import httpx

from laneway.testing import VLLM_MODEL_NAME, VllmProcess
from live_server import LiveServer, live_server
from vllm_helpers import upstream_config

TIMEOUT_S = 120.0


def waiting_in(vllm: VllmProcess) -> int:
    text = httpx.get(vllm.url.removesuffix("/v1") + "/metrics", timeout=10).text
    return round(sum(float(v) for v in re.findall(r"^vllm:num_requests_waiting\{[^}]*\} (\S+)$", text, re.M)))


async def first_tokens(
    base: str,
    bodies: list[dict[str, object]],
    gap_s: float = 0.0,
    before_last: Callable[[], Awaitable[None]] | None = None,
) -> list[float]:
    """Each body streamed (started ``gap_s`` apart; the last once ``before_last`` returned):
    when its first text came."""
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:

        async def one(i: int, body: dict[str, object]) -> float:
            await asyncio.sleep(i * gap_s)
            if before_last is not None and i == len(bodies) - 1:
                await before_last()
            async with client.stream("POST", base + "/completions", json={**body, "stream": True}) as r:
                assert r.status_code == 200, await r.aread()
                first = None
                async for line in r.aiter_lines():
                    if first is None and '"text":"' in line and '"text":""' not in line:
                        first = time.monotonic()
            assert first is not None
            return first

        return list(await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies))))


def p(priority: str, i: int, tokens: int) -> dict[str, object]:
    return {
        "model": "tiny",
        "prompt": f"request {i}",
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
        "priority": priority,
    }


def test_an_engine_given_too_many_slots_is_gated_at_once_and_what_it_queued_comes_back(
    vllm: VllmProcess, tmp_path: Path
) -> None:
    """20 requests, 12 slots in front of a vLLM that runs 4: it queues 8 at first. Sent
    more than it was seen to run, laneway reads its gauges soon (not at the next probe, 5 s
    away), learns it runs 4 (12 sent, 8 waiting) and takes the 8 back, so that what waits,
    waits in laneway, where priority holds: the engine's queue is empty while laneway holds
    16, within a second or so; and every request ends."""
    config = replace(upstream_config(tmp_path, vllm.url, slots=12), probe_interval_s=5.0)
    seen: dict[str, float] = {"least": 12, "queued_here": 0, "drained_at": -1.0, "samples": 0}

    async def main(server: LiveServer) -> list[float]:
        await asyncio.sleep(0.5)  # (past the probe at start-up)
        t0 = time.monotonic()
        flood = asyncio.ensure_future(first_tokens(server.base_url, [p("P3", i, 400) for i in range(20)]))
        window = server.runtime.engines.saturation.windows["v0"]
        while not flood.done() and time.monotonic() - t0 < TIMEOUT_S:
            await asyncio.sleep(0.1)
            seen["least"] = min(seen["least"], window.limit)
            queued = server.runtime.sched.queued
            seen["queued_here"] = max(seen["queued_here"], queued)
            if seen["drained_at"] < 0 and queued >= 15:
                seen["samples"] += 1
                if await asyncio.to_thread(waiting_in, vllm) == 0:
                    seen["drained_at"] = time.monotonic() - t0
        return await flood

    with live_server(config) as server:
        firsts = asyncio.run(main(server))
    assert len(firsts) == 20  # (every request streamed to its end: first_tokens checks each)
    assert seen["least"] == 4, seen  # what the engine runs: 12 sent less 8 waiting
    assert seen["queued_here"] >= 15, seen  # (without the take-back: 8 at most)
    assert 0 <= seen["drained_at"] < 3.0, seen  # (a probe would have come at 5 s)


def test_the_class_is_vllms_priority_so_p0_goes_ahead_of_its_queue(vllm: VllmProcess, tmp_path: Path) -> None:
    """8 P3 requests fill vLLM's 4 sequences and queue 4 inside it; a P0 sent there next
    starts before those 4 when vLLM is told its class, after them when it is not."""

    def run(forward: bool) -> int:
        config = upstream_config(
            tmp_path / str(forward), vllm.url, slots=9, adapt_slots=False, forward_priority=forward
        )
        bodies = [p("P3", i, 200) for i in range(8)] + [p("P0", 99, 4)]

        async def four_waiting() -> None:  # (the P0 sent once vLLM queues 4: on a busy machine
            deadline = time.monotonic() + 60  # the P3s' requests may reach it late)
            while await asyncio.to_thread(waiting_in, vllm) < 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)

        with live_server(config) as server:
            firsts = asyncio.run(first_tokens(server.base_url, bodies, gap_s=0.05, before_last=four_waiting))
        urgent = firsts[-1]
        return sum(1 for t in firsts[:-1] if t > urgent)  # P3s that started after the P0

    assert VLLM_MODEL_NAME == "tiny"
    assert run(forward=True) >= 3
    assert run(forward=False) == 0


def counters_of(vllm: VllmProcess) -> tuple[float, float]:
    """vLLM's own prefix-cache counters: prompt tokens looked up, tokens found."""
    text = httpx.get(vllm.url.removesuffix("/v1") + "/metrics", timeout=10).text
    return tuple(  # type: ignore[return-value]
        sum(float(v) for v in re.findall(rf"^vllm:prefix_cache_{name}_total\{{[^}}]*\}} (\S+)$", text, re.M))
        for name in ("queries", "hits")
    )


def test_the_prefix_hit_rate_vllm_reports_is_read_at_each_probe(vllm: VllmProcess, tmp_path: Path) -> None:
    """Four prompts that share a long head: vLLM finds it cached for the last three, and
    says so in its counters; laneway shows the rate it reports (/metrics, the dashboard)."""
    config = replace(upstream_config(tmp_path, vllm.url, slots=4), probe_interval_s=0.2)
    head = "Read the following instructions with care before you answer the question. " * 30
    with live_server(config) as server:
        watch = server.runtime.engines
        for _ in range(100):  # (its first reading, at the first probe)
            if "v0" in watch.hits:
                break
            time.sleep(0.05)
        for i in range(4):
            body = {"model": "tiny", "prompt": head + f"Question {i}?", "max_tokens": 2, "temperature": 0}
            r = httpx.post(server.base_url + "/completions", json=body, timeout=TIMEOUT_S)
            assert r.status_code == 200, r.text
        queries, hits = counters_of(vllm)
        for _ in range(100):  # (read at the next probes)
            if watch.hits["v0"].queries == queries:
                break
            time.sleep(0.05)
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        first = watch.hits["v0"]
    found = re.search(r'^laneway_worker_prefix_hit_ratio_reported\{worker="v0"\} (\S+)$', metrics, re.M)
    assert found is not None, metrics
    own = (hits - first.hits0) / (queries - first.queries0)
    assert float(found.group(1)) == own and 0.5 < own < 1, (own, queries, hits)


def test_an_agents_turns_go_to_the_worker_that_holds_its_prompt(vllm: VllmProcess, tmp_path: Path) -> None:
    """Two upstream workers of the model (both in front of the session's vLLM): chat turns of
    three agents, each with a long system prompt in the model's own chat template, each
    agent's on one worker; vLLM finds each agent's prompt cached from its second turn."""
    one = upstream_config(tmp_path, vllm.url, slots=4)
    worker = one.workers[0]
    config = replace(one, workers=(worker, replace(worker, name="v1")))
    placed: dict[str, set[str]] = {}
    queries, hits = counters_of(vllm)
    with live_server(config) as server:
        for i in range(9):
            agent = "ABC"[i % 3]
            system = f"You are agent {agent}. " + f"Agent {agent} answers with care and in few words. " * 25
            body = {
                "model": "tiny",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"Turn {i}?"},
                ],
                "max_tokens": 2,
                "temperature": 0,
            }
            r = httpx.post(server.base_url + "/chat/completions", json=body, timeout=TIMEOUT_S)
            assert r.status_code == 200, r.text
            placed.setdefault(agent, set()).add(r.json()["laneway"]["worker"])
    assert all(len(ws) == 1 for ws in placed.values()), placed
    assert {w for ws in placed.values() for w in ws} == {"v0", "v1"}  # (new prompts spread)
    queries2, hits2 = counters_of(vllm)
    assert (hits2 - hits) / (queries2 - queries) > 0.5  # 6 of 9 turns found their agent's prompt
