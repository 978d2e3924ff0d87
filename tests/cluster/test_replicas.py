"""Three replicas, one leader scheduling for all, in front of two stand-in engines: P0 first
across replicas, an upstream never sees more than its slots, quotas hold in total.

The replicas run in this process on the in-process bus (``memory://``, :mod:`laneway.bus`)
and reach in-process stand-ins (:mod:`laneway.backends.inprocess`): their HTTP, leader,
lease, loans and Lua scripts are the real ones, without a process or a ``redis-server``.
Real processes on a real Redis, through faults: test_faults.py, test_failover.py,
test_pauses.py, test_shared_batches.py."""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from cluster_util import inprocess_replicas
from laneway.standin import StandIn

NAMES = ["r1", "r2", "r3"]


def body(priority: str, tokens: int, prompt: str = "x") -> dict[str, Any]:
    return {"model": "m", "prompt": prompt, "max_tokens": tokens, "priority": priority}


def two_standins(slots: int) -> dict[str, StandIn]:
    """Two stand-in engines of ``slots`` (5 ms a token), by the names of their workers."""
    return {f"up{i}": StandIn(slots=slots, ms_per_token=5) for i in range(2)}


def test_p0_first_across_replicas_and_an_upstream_never_over_its_slots(
    tmp_path: Path, memory_bus: str
) -> None:
    engines = two_standins(2)
    with inprocess_replicas(tmp_path, memory_bus, NAMES, engines, 2) as reps:
        urls = [reps[n].url + "/v1" for n in NAMES]

        async def go() -> tuple[list[float], list[float], list[int]]:
            async with httpx.AsyncClient(timeout=120) as c:

                async def timed(url: str, b: dict[str, Any]) -> tuple[float, int]:
                    t0 = time.perf_counter()
                    r = await c.post(url + "/completions", json=b)
                    return time.perf_counter() - t0, r.status_code

                idle = [(await timed(urls[i % 3], body("P0", 8)))[0] for i in range(6)]
                flood = [
                    asyncio.create_task(timed(urls[i % 3], body("P3", 200, f"job {i}"))) for i in range(40)
                ]
                await asyncio.sleep(1.0)  # every slot busy with P3, the rest queued at the leader
                urgent = []
                for i in range(6):
                    took, status = await timed(urls[i % 3], body("P0", 8))
                    assert status == 200
                    urgent.append(took)
                statuses = [s for _, s in await asyncio.gather(*flood)]
                return idle, urgent, statuses

        idle, urgent, statuses = asyncio.run(go())
        assert statuses == [200] * 40  # the flood was all served, in the end
        stats = [{"peak_requests": e.peak_requests, "served": e.served} for e in engines.values()]
        for s in stats:  # never more than its slots, across 3 replicas
            assert s["peak_requests"] <= 2, stats
        assert sum(s["served"] for s in stats) >= 40 + 12  # both engines served
        assert all(s["served"] >= 5 for s in stats), stats
        # P0 preempts the flood wherever it arrived: nowhere near the flood's 40 × 1 s / 4 slots
        assert statistics.median(urgent) < statistics.median(idle) + 1.5, (idle, urgent)


def test_a_tenants_quota_holds_in_total_not_per_replica(tmp_path: Path, memory_bus: str) -> None:
    from laneway.config import hash_key

    tenant = (
        f'[tenants.t]\nkey_sha256 = ["{hash_key("t-key")}"]\nallowed = ["P0", "P1"]\n'
        "[tenants.t.quotas]\nP0 = { rate_per_s = 2, burst = 2 }\n"
        f'[tenants.u]\nkey_sha256 = ["{hash_key("u-key")}"]\n'
        "[tenants.u.quotas]\nP1 = { rate_per_s = 0.01, burst = 1 }\n"
    )
    engines = {"up": StandIn(slots=8, ms_per_token=0)}
    with inprocess_replicas(tmp_path, memory_bus, NAMES, engines, 8, extra=tenant) as reps:
        urls = [reps[n].url + "/v1/completions" for n in NAMES]

        async def go() -> tuple[list[int], float, list[str]]:
            async with httpx.AsyncClient(timeout=30, headers={"Authorization": "Bearer t-key"}) as c:
                t0 = time.monotonic()
                statuses: list[int] = []
                retry: list[str] = []
                for i in range(36):  # 12 a second, spread over the three replicas
                    r = await c.post(urls[i % 3], json=body("P0", 2))
                    statuses.append(r.status_code)
                    if r.status_code == 429:
                        retry.append(r.headers["retry-after"])
                    await asyncio.sleep(1 / 12)
                return statuses, time.monotonic() - t0, retry

        statuses, took, retry = asyncio.run(go())
        # on every replica, leader or not: a class the tenant may not use is a 403 (the
        # configuration says so), one it may use an estimate
        key = {"Authorization": "Bearer t-key"}
        for n in NAMES:
            est = reps[n].url + "/v1/queue/estimate"
            r = httpx.get(est, params={"priority": "P3"}, headers=key)
            assert r.status_code == 403 and r.json()["error"]["code"] == "class_not_allowed", r.text
            assert httpx.get(est, params={"priority": "P1"}, headers=key).status_code == 200
        # the leader's replica knows the quotas, and counts them in its estimate (the others
        # leave them out, as documented)
        u = {"Authorization": "Bearer u-key"}
        assert httpx.post(urls[0], json=body("P1", 2), headers=u, timeout=30).status_code == 200
        for n in NAMES:
            ready = httpx.get(reps[n].url + "/readyz").json()["cluster"]
            got = httpx.get(reps[n].url + "/v1/queue/estimate", params={"priority": "P1"}, headers=u).json()
            if ready["leading"]:
                assert got["quota"]["reason"] == "rate_limited" and got["estimated_wait_s"] > 50, got
            else:
                assert got["quota"] is None, got
    ok, limited = statuses.count(200), statuses.count(429)
    assert ok + limited == len(statuses), statuses
    # a bucket of 2 refilled at 2/s over the run, in total: per replica it would be 3 times that
    assert 2 <= ok <= 2 + 2 * took + 1, (ok, took)
    assert limited >= len(statuses) - (2 + 2 * took + 1)
    assert retry and all(int(x) >= 1 for x in retry)


def lent_starts(url: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("laneway_cluster_lent_starts_total "):
            return float(line.split()[1])
    raise AssertionError("no laneway_cluster_lent_starts_total in /metrics")


def test_short_requests_start_on_lent_slots_and_an_upstream_stays_within_its_slots(
    tmp_path: Path, memory_bus: str
) -> None:
    engines = two_standins(3)
    with inprocess_replicas(tmp_path, memory_bus, NAMES, engines, 3) as reps:
        urls = [reps[n].url + "/v1" for n in NAMES]

        async def go() -> list[int]:
            async with httpx.AsyncClient(timeout=120) as c:
                statuses: list[int] = []

                async def client(k: int, n: int, prio: str, tokens: int) -> None:
                    for i in range(n):  # one after another, on replica k % 3
                        b = body(prio, tokens, f"{k}.{i}")
                        r = await c.post(urls[k % 3] + "/completions", json=b)
                        statuses.append(r.status_code)

                # a client of short requests on each replica (fewer than the slots: they are
                # lent), then 8 of them and 2 of long ones (more than the slots: loans called
                # back, the leader places them)
                await asyncio.gather(*(client(k, 20, "P2", 4) for k in range(3)))
                await asyncio.gather(
                    *(client(k, 10, "P2", 4) for k in range(8)),
                    *(client(k, 2, "P3", 150) for k in range(2)),
                )
                return statuses

        statuses = asyncio.run(go())
        lent = [lent_starts(reps[n].url) for n in NAMES]
        stats = [{"peak_requests": e.peak_requests} for e in engines.values()]
    assert statuses == [200] * (60 + 80 + 4)
    for s in stats:  # the leader's requests and the lent ones together: never more than its slots
        assert s["peak_requests"] <= 3, stats
    assert sum(lent) >= 30, lent  # most of the short ones, once their replica had a loan


def test_an_agents_turns_go_where_its_prompt_is_cached_on_lent_slots_too(
    tmp_path: Path, memory_bus: str
) -> None:
    """Four agents (a long system prompt each), their turns sent to the three replicas in
    turn: the leader places an agent's first turn; the replicas start later turns on lent
    slots of that very engine, and the leader hears where (its own index follows)."""
    engines = {f"up{i}": StandIn(slots=4, ms_per_token=1) for i in range(2)}
    with inprocess_replicas(tmp_path, memory_bus, NAMES, engines, 4) as reps:
        urls = [reps[n].url + "/v1" for n in NAMES]

        async def go() -> list[tuple[str, str]]:
            placed = []
            async with httpx.AsyncClient(timeout=60) as c:
                for i in range(24):
                    agent = "ABCD"[i % 4]
                    system = f"You are agent {agent}. " + f"Agent {agent} knows this well. " * 40
                    chat = {
                        "model": "m",
                        "messages": [
                            {"role": "system", "content": system},
                            {"role": "user", "content": f"turn {i}"},
                        ],
                        "max_tokens": 2,
                        "priority": "P2",
                    }
                    r = await c.post(urls[i % 3] + "/chat/completions", json=chat)
                    assert r.status_code == 200, r.text
                    placed.append((agent, r.json()["laneway"]["worker"]))
            return placed

        placed = asyncio.run(go())
        lent = sum(lent_starts(reps[n].url) for n in NAMES)
    by_agent: dict[str, set[str]] = {}
    for agent, worker in placed:
        by_agent.setdefault(agent, set()).add(worker)
    assert all(len(ws) == 1 for ws in by_agent.values()), by_agent  # each agent on one engine
    assert {w for ws in by_agent.values() for w in ws} == {"up0", "up1"}  # and both engines used
    assert lent >= 8, lent  # (most later turns started on lent slots)


def test_a_replica_runs_what_a_leader_of_another_configuration_starts_there(
    tmp_path: Path, memory_bus: str
) -> None:
    """r1 leads, its worker of 4 slots; r2's worker of the same engine has 2. The leader's
    count holds for all: 4 requests sent to r2 all run (2 of them were a 502, "all 2 slots
    of worker up are busy"), and the engine never runs more than the leader's 4."""
    engines = {"up": StandIn(slots=8, ms_per_token=20)}
    lead = {"r1": "leader_priority = 2\n"}
    slots = {"r1": 4, "r2": 2}
    with inprocess_replicas(tmp_path, memory_bus, ["r1", "r2"], engines, slots, cluster=lead) as reps:

        async def go() -> list[int]:
            async with httpx.AsyncClient(timeout=60) as c:
                for _ in range(200):  # (r1 takes the lease from whoever held it first)
                    r = await c.get(reps["r1"].url + "/readyz")
                    if r.status_code == 200 and r.json().get("cluster", {}).get("leading"):
                        break
                    await asyncio.sleep(0.05)
                url = reps["r2"].url + "/v1/completions"
                got = await asyncio.gather(*(c.post(url, json=body("P2", 20, f"j{i}")) for i in range(4)))
                return [r.status_code for r in got]

        statuses = asyncio.run(go())
    assert statuses == [200] * 4, statuses
    assert engines["up"].peak_requests == 4


def test_the_files_a_batch_wrote_are_in_the_journal_of_the_replica_that_wrote_them(
    tmp_path: Path, memory_bus: str
) -> None:
    """So that a loss of Redis's data names them, and they answer 410, not 404 (only the
    batch and its input were journaled: made through the API)."""
    import openai

    engines = {"up": StandIn(slots=4, ms_per_token=1)}
    with (
        inprocess_replicas(tmp_path, memory_bus, ["r1"], engines, 4) as reps,
        openai.OpenAI(base_url=reps["r1"].url + "/v1", api_key="none", max_retries=0) as c,
    ):
        lines = b"".join(
            json.dumps(
                {"custom_id": f"k{i}", "method": "POST", "url": "/v1/completions", "body": body("P3", 3)}
            ).encode()
            + b"\n"
            for i in range(2)
        )
        f = c.files.create(file=("in.jsonl", lines), purpose="batch")
        b = c.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="24h")
        for _ in range(300):  # (bounded: 30 s)
            b = c.batches.retrieve(b.id)
            if b.status in ("completed", "failed"):
                break
            time.sleep(0.1)
        assert b.status == "completed" and b.output_file_id, b
    made = [json.loads(x) for x in (tmp_path / "r1" / "cluster-journal.jsonl").read_text().splitlines()]
    assert {(m["kind"], m["id"]) for m in made} == {
        ("file", f.id),
        ("batch", b.id),
        ("file", b.output_file_id),
    }


def _gauges(base: str) -> dict[str, float]:
    """The class and worker gauges a replica's /metrics has, summed over their labels' values
    (per worker for the slots)."""
    text = httpx.get(base + "/metrics", timeout=10).text
    out: dict[str, float] = {}
    for name, labels, value in re.findall(r"^(laneway_[a-z_]+)\{([^}]*)\} (\S+)$", text, re.M):
        if name in ("laneway_queue_depth", "laneway_running_requests", "laneway_worker_slots_busy"):
            out[name] = out.get(name, 0.0) + float(value)
        elif name == "laneway_worker_slots":
            out[f"{name}{{{labels}}}"] = float(value)
    return out


def test_a_replicas_queued_and_running_gauges_sum_to_the_clusters(tmp_path: Path, memory_bus: str) -> None:
    """Each replica's ``laneway_queue_depth`` and ``laneway_running_requests`` are its own
    requests (as its dashboard counts them): the dashboard's sum over the replicas is the
    cluster's, not as many times the cluster's as there are replicas."""
    engines = two_standins(2)
    with inprocess_replicas(tmp_path, memory_bus, NAMES, engines, 2) as reps:
        urls = [reps[n].url + "/v1" for n in NAMES]

        async def go() -> tuple[list[dict[str, float]], list[int]]:
            async with httpx.AsyncClient(timeout=120) as c:
                # 12 long requests over the three replicas: 4 run (2 engines of 2 slots), 8 wait
                jobs = [
                    asyncio.create_task(c.post(urls[i % 3] + "/completions", json=body("P3", 300, f"j{i}")))
                    for i in range(12)
                ]
                seen: list[dict[str, float]] = []
                for _ in range(50):  # (until the slots are taken, at most 5 s)
                    await asyncio.sleep(0.1)
                    seen = [await asyncio.to_thread(_gauges, reps[n].url) for n in NAMES]
                    if sum(g.get("laneway_worker_slots_busy", 0) for g in seen) >= 4:
                        break
                return seen, [r.status_code for r in await asyncio.gather(*jobs)]

        seen, statuses = asyncio.run(go())
    assert statuses == [200] * 12
    assert sum(g["laneway_running_requests"] for g in seen) == 4, seen
    assert sum(g["laneway_queue_depth"] for g in seen) == 8, seen
    assert sum(g["laneway_worker_slots_busy"] for g in seen) == 4, seen
    for g in seen:  # each replica took 4, and says so
        assert g["laneway_running_requests"] + g["laneway_queue_depth"] == 4, seen
        # a worker's slots are the worker's on every replica (the dashboard takes one of them)
        assert g['laneway_worker_slots{worker="up0"}'] == 2, seen
