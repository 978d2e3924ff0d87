"""Two upstream engines of several slots each: the server spreads requests over them (their
apps in this process, reached through in-memory transports: laneway.backends.inprocess)."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import httpx
import pytest

from laneway.api.dashboard import snapshot
from laneway.backends.factory import build_upstream
from laneway.backends.inprocess import InProcess
from laneway.config import load_config
from laneway.core.prefix_cache import BLOCK_TOKENS
from laneway.fault_harness import upstream_toml
from laneway.standin import StandIn
from live_server import live_server


def config_file(tmp_path: Path, placement: str | None) -> Path:
    path = tmp_path / "laneway.toml"
    toml = f'[server]\ndata_dir = "{tmp_path / "data"}"\n'
    if placement is not None:
        toml += f'\n[scheduler]\nplacement = "{placement}"\n'
    toml += upstream_toml("up0", "http://up0.invalid/v1", 4) + upstream_toml(
        "up1", "http://up1.invalid/v1", 4
    )
    path.write_text(toml)
    return path


async def send(url: str, n: int, tokens: int) -> list[int]:
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int) -> int:
            body = {"model": "m", "prompt": f"job {i}", "max_tokens": tokens, "priority": "P2"}
            r = await client.post(url + "/completions", json=body)
            return r.status_code

        return await asyncio.gather(*(one(i) for i in range(n)))


@pytest.mark.parametrize("placement", [None, "round-robin"], ids=["default", "round-robin"])
def test_four_requests_on_two_engines_of_four_slots_run_two_and_two(
    tmp_path: Path, placement: str | None
) -> None:
    """Found failing: the worker idle longest took every request while it had a free slot, so
    one engine ran four and the other none (with real vLLMs: 2x the time to first token)."""
    config = load_config(config_file(tmp_path, placement))
    assert config.scheduler.placement == (placement or "prefix")
    engines = {"up0": StandIn(slots=4, ms_per_token=10), "up1": StandIn(slots=4, ms_per_token=10)}
    workers = {w.name: build_upstream(w, connect=InProcess(engines[w.name])) for w in config.workers}
    with live_server(config, workers) as server:
        statuses = asyncio.run(send(server.base_url, 4, 40))
    assert statuses == [200] * 4
    assert [e.served for e in engines.values()] == [2, 2]
    assert [e.peak_requests for e in engines.values()] == [2, 2]


def agents_config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "laneway.toml"
    toml = f'[server]\ndata_dir = "{tmp_path / "data"}"\nprobe_interval_s = 0.2\n'
    toml += upstream_toml("up0", "http://up0.invalid/v1", 4) + extra
    toml += upstream_toml("up1", "http://up1.invalid/v1", 4)
    path.write_text(toml)
    return path


async def turns(url: str, agents: list[str]) -> list[str]:
    """One chat request after another, each of one of ``agents`` (a system prompt each):
    the worker each ran on."""
    out = []
    async with httpx.AsyncClient(timeout=60) as client:
        for i, agent in enumerate(agents):
            system = f"You are agent {agent}. " + f"Agent {agent} knows this well. " * 30
            body = {
                "model": "m",
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"turn {i}"}],
                "max_tokens": 4,
            }
            r = await client.post(url + "/chat/completions", json=body)
            assert r.status_code == 200, r.text
            out.append(r.json()["laneway"]["worker"])
    return out


def test_an_agents_turns_go_where_its_system_prompt_is_cached(tmp_path: Path) -> None:
    config = load_config(agents_config(tmp_path))
    engines = {"up0": StandIn(slots=4, ms_per_token=0), "up1": StandIn(slots=4, ms_per_token=0)}
    workers = {w.name: build_upstream(w, connect=InProcess(engines[w.name])) for w in config.workers}
    with live_server(config, workers) as server:
        placed = asyncio.run(turns(server.base_url, ["A", "B", "C", "D", "A", "B", "C", "D", "B", "A"]))
        engines_say = server.runtime.engines  # type: ignore[attr-defined]
        for _ in range(100):  # (the engines' counters are read at probes: every 0.2 s)
            if len(engines_say.reported_hits()) == 2 and all(
                e.prefix_queries == engines_say.hits[n].queries for n, e in engines.items()
            ):
                break
            time.sleep(0.05)
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        board = {w["name"]: w for w in snapshot(server.runtime)["workers"]}  # type: ignore[arg-type]
    expected, reported = (
        {w: float(x) for w, x in re.findall(rf'^{name}\{{worker="(\w+)"\}} (\S+)$', metrics, re.M)}
        for name in ("laneway_worker_prefix_hit_ratio_expected", "laneway_worker_prefix_hit_ratio_reported")
    )
    assert set(expected) == {"up0", "up1"} and all(0.3 < x < 1 for x in expected.values()), expected
    # what each engine counted itself (the stand-in's own cache, in token ids), since the first probe
    assert set(reported) == {"up0", "up1"} and all(0.3 < x < 1 for x in reported.values()), reported
    for name, engine in engines.items():
        first = engines_say.hits[name]
        own = (engine.prefix_hits - first.hits0) / (engine.prefix_queries - first.queries0)
        assert reported[name] == pytest.approx(own)
        assert board[name]["prefix_hits_reported"] == pytest.approx(own)
        assert board[name]["prefix_hits_expected"] == pytest.approx(expected[name])
        assert board[name]["concurrency"] == 4  # (the gate's limit: nothing saturated it)
    by_agent: dict[str, set[str]] = {}
    for agent, worker in zip("ABCDABCDBA", placed, strict=True):
        by_agent.setdefault(agent, set()).add(worker)
    assert all(len(ws) == 1 for ws in by_agent.values()), by_agent  # each agent on one engine
    assert {w for ws in by_agent.values() for w in ws} == {"up0", "up1"}  # and both engines used


def test_an_agents_turn_stops_batch_work_on_the_engine_holding_its_prompt(tmp_path: Path) -> None:
    """The engine holding an agent's prompt is full of batch work, the other has a free
    slot: the agent's next turn (P0) stops a batch request there and runs there, and the
    batch request resumes and ends (found with two vLLMs under a batch flood: agents'
    turns started on the free slot and paid their whole prefill again)."""
    config = load_config(agents_config(tmp_path))
    engines = {"up0": StandIn(slots=4, ms_per_token=5), "up1": StandIn(slots=4, ms_per_token=5)}
    workers = {w.name: build_upstream(w, connect=InProcess(engines[w.name])) for w in config.workers}
    # (a long prompt, ~750 tokens: its prefill elsewhere costs more than a batch request stopped)
    system = "You are agent A. " + "Agent A knows this well. " * 120

    def body(user: str, priority: str, tokens: int) -> dict[str, object]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return {"model": "m", "messages": messages, "max_tokens": tokens, "priority": priority}

    async def scene(url: str) -> tuple[str, str, list[dict[str, object]]]:
        async with httpx.AsyncClient(timeout=60) as client:
            first = (await client.post(url + "/chat/completions", json=body("turn 0", "P0", 2))).json()
            home = first["laneway"]["worker"]
            # batch work with the agent's prompt: where it is, while that engine has a slot;
            # then one with a prompt of its own, on the other engine
            batch = [body(f"job {i}", "P3", 400) for i in range(4)]
            batch.append(
                {"model": "m", "prompt": "a job of its own " * 20, "max_tokens": 400, "priority": "P3"}
            )
            jobs = []
            for b in batch:
                path = "/chat/completions" if "messages" in b else "/completions"
                jobs.append(asyncio.create_task(client.post(url + path, json=b)))
                await asyncio.sleep(0.1)  # (in this order)
            await asyncio.sleep(0.3)
            turn = (await client.post(url + "/chat/completions", json=body("turn 1", "P0", 2))).json()
            done = [r.json() for r in await asyncio.gather(*jobs)]
            return home, turn["laneway"]["worker"], done

    with live_server(config, workers) as server:
        home, went, done = asyncio.run(scene(server.base_url))
    assert went == home
    stopped = [d for d in done if d["laneway"]["preemptions"]]
    assert len(stopped) == 1 and stopped[0]["usage"]["completion_tokens"] == 400
    assert all(d["laneway"]["worker"] for d in done)


def test_an_engine_that_restarted_is_expected_to_hold_nothing(tmp_path: Path) -> None:
    """Its prefix-cache counters went back (read at the next probe), or a probe found no
    engine of its model there and then one: placement forgets what it sent there."""
    config = load_config(agents_config(tmp_path))
    engines = {"up0": StandIn(slots=4, ms_per_token=0), "up1": StandIn(slots=4, ms_per_token=0)}
    workers = {w.name: build_upstream(w, connect=InProcess(engines[w.name])) for w in config.workers}
    with live_server(config, workers) as server:
        index = server.runtime.sched.placement.index  # type: ignore[attr-defined]
        placed = asyncio.run(turns(server.base_url, ["A", "B", "A", "B"]))
        where = dict(zip("AB", placed[:2], strict=True))
        assert placed[2:] == placed[:2] and set(placed) == {"up0", "up1"}  # each where it is cached
        watch = server.runtime.engines  # type: ignore[attr-defined]
        for _ in range(100):  # (the counters are read at probes: every 0.2 s)
            if all(watch.hits[n].queries == e.prefix_queries for n, e in engines.items()):
                break
            time.sleep(0.05)
        cold = where["A"]
        assert index.held(cold) > 0
        engines[cold].cache.clear()  # its engine restarted: an empty cache, counters from 0
        engines[cold].prefix_queries = engines[cold].prefix_hits = 0
        for _ in range(100):
            if index.held(cold) == 0:
                break
            time.sleep(0.05)
        assert index.held(cold) == 0
        warm = where["B"]
        assert index.held(warm) > 0  # (the other engine's is kept)
        # another engine answers where the other was (its model is not ours): out of
        # placement; when ours is back, it is taken as a fresh engine
        ours, engines[warm].model = engines[warm].model, "another"
        for _ in range(100):
            if warm in server.runtime.recovery.down:
                break
            time.sleep(0.05)
        assert warm in server.runtime.recovery.down and index.held(warm) > 0
        engines[warm].model = ours
        for _ in range(100):
            if warm not in server.runtime.recovery.down:
                break
            time.sleep(0.05)
        assert warm not in server.runtime.recovery.down and index.held(warm) == 0


def test_the_engines_kv_space_bounds_what_it_is_expected_to_hold(tmp_path: Path) -> None:
    """Read from the engine's /metrics (vllm:cache_config_info), unless configured."""
    config = load_config(agents_config(tmp_path, extra="kv_tokens = 3200\n"))
    engines = {"up0": StandIn(kv_tokens=6400), "up1": StandIn(kv_tokens=12_800)}
    workers = {w.name: build_upstream(w, connect=InProcess(engines[w.name])) for w in config.workers}
    with live_server(config, workers) as server:
        index = server.runtime.sched.placement.index  # type: ignore[attr-defined]
        for _ in range(200):  # (learnt at a probe: every 0.2 s)
            if index.capacity("up1") == 12_800 // BLOCK_TOKENS:
                break
            time.sleep(0.05)
        assert index.capacity("up1") == 12_800 // BLOCK_TOKENS  # as its engine says
        assert index.capacity("up0") == 3200 // BLOCK_TOKENS  # as configured
        assert workers["up1"].capabilities()["kv_tokens"] == 12_800  # type: ignore[index]


async def flood(url: str, n: int, tokens: int, server: object, engine: StandIn) -> dict[str, int]:
    """``n`` P3 requests at once; while they run, the most the engine queued itself after
    the gate had time to act, and the least concurrency laneway gave it."""
    seen = {"late_waiting": 0, "least_limit": 99, "queued_here": 0}
    async with httpx.AsyncClient(timeout=120) as client:

        async def one(i: int) -> int:
            body = {"model": "m", "prompt": f"batch {i}", "max_tokens": tokens, "priority": "P3"}
            return (await client.post(url + "/completions", json=body)).status_code

        jobs = [asyncio.ensure_future(one(i)) for i in range(n)]
        window = server.runtime.engines.saturation.windows["up0"]  # type: ignore[attr-defined]
        t0 = time.monotonic()
        while not all(j.done() for j in jobs) and time.monotonic() - t0 < 60:
            await asyncio.sleep(0.05)
            seen["least_limit"] = min(seen["least_limit"], window.limit)
            seen["queued_here"] = max(seen["queued_here"], server.runtime.sched.queued)  # type: ignore[attr-defined]
            if time.monotonic() - t0 > 3.0:  # (the gate acts at probes: every 0.2 s)
                seen["late_waiting"] = max(seen["late_waiting"], len(engine.waiting))
        statuses = await asyncio.gather(*jobs)
    assert statuses == [200] * n
    return seen


def test_an_engine_given_too_many_slots_is_sent_what_it_can_run(tmp_path: Path) -> None:
    """The saturation gate: an engine of 2 sequences behind a worker of 8 slots queues 6
    of its own at first; its own gauges say so, and laneway holds the rest in its queue
    (where priority holds) until the engine drained, then gives it more as it keeps up."""
    path = tmp_path / "laneway.toml"
    toml = f'[server]\ndata_dir = "{tmp_path / "data"}"\nprobe_interval_s = 0.2\n'
    path.write_text(toml + upstream_toml("up0", "http://up0.invalid/v1", 8))
    config = load_config(path)
    engine = StandIn(slots=2, ms_per_token=5)
    workers = {"up0": build_upstream(config.workers[0], connect=InProcess(engine))}
    with live_server(config, workers) as server:
        seen = asyncio.run(flood(server.base_url, 16, 150, server, engine))
        limit = server.runtime.engines.saturation.windows["up0"].limit
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
    # before the first probe it is sent more than it runs (all 8 slots, or fewer where the
    # first probe, at 0.2 s, came before the last request did: a busy host)
    assert engine.peak_requests > 2
    assert seen["least_limit"] <= 2 and seen["queued_here"] >= 8
    assert seen["late_waiting"] <= 1  # drained: what waits, waits in laneway
    assert f'laneway_worker_concurrency{{worker="up0"}} {float(limit)}' in metrics


def test_an_engine_that_orders_by_priority_is_told_each_requests_class(tmp_path: Path) -> None:
    """forward_priority: vLLM's `priority` (lower first) is laneway's class rank; the
    client's own `priority` (laneway's) is not passed on as sent."""
    path = tmp_path / "laneway.toml"
    toml = f'[server]\ndata_dir = "{tmp_path / "data"}"\n\n[scheduler]\nplacement = "round-robin"\n'
    toml += upstream_toml("up0", "http://up0.invalid/v1", 4) + "forward_priority = true\n"
    toml += upstream_toml("up1", "http://up1.invalid/v1", 4)
    path.write_text(toml)
    config = load_config(path)
    engines = {"up0": StandIn(ms_per_token=0), "up1": StandIn(ms_per_token=0)}
    workers = {w.name: build_upstream(w, connect=InProcess(engines[w.name])) for w in config.workers}

    async def send_all(url: str) -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            for cls in ("P0", "P3", "P1", "P2"):
                body = {"model": "m", "prompt": f"a {cls} request", "max_tokens": 2, "priority": cls}
                r = await client.post(url + "/completions", json=body)
                assert r.status_code == 200

    with live_server(config, workers) as server:
        asyncio.run(send_all(server.base_url))
    # in turn: up0 ran the P0 and the P1 request, up1 (not told) the P3 and the P2
    assert list(engines["up0"].priorities) == [0, 1]
    assert list(engines["up1"].priorities) == [None, None]


def test_a_prompt_counts_as_prefill_on_its_engine_until_its_first_token(tmp_path: Path) -> None:
    """The placement weighs a prompt its engine still prefills (uncached tokens) as more
    running requests; the server tells the core when each request's first token comes, so
    a decoding request weighs as one again."""
    config = load_config(agents_config(tmp_path))
    engines = {"up0": StandIn(slots=4, ms_per_token=100), "up1": StandIn(slots=4, ms_per_token=100)}
    workers = {w.name: build_upstream(w, connect=InProcess(engines[w.name])) for w in config.workers}
    system = "You are a careful agent. " + "Read every file before you answer. " * 60
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "go"}],
        "max_tokens": 30,
        "stream": True,
    }
    with live_server(config, workers) as server:
        sched = server.runtime.sched
        with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=30) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            while not re.search(r'"content": ?"[^"]', next(lines)):  # (its first token: after a role)
                pass
            time.sleep(0.05)  # (the chunk is sent as the core hears of it: on the same loop)
            (rid,) = sched.live_requests.reqs  # type: ignore[attr-defined]
            req = sched.get(rid)  # type: ignore[attr-defined]
            assert req.prefilled and req.prefill_left == 0
            assert [w.prefill for w in sched.workers.values()] == [0, 0]  # type: ignore[attr-defined]
            assert sum(len(w.running) for w in sched.workers.values()) == 1  # type: ignore[attr-defined]
            for _ in lines:
                pass
