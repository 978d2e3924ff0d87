"""SIGKILL the leader under load, again and again: a standby leads within 5 s, every
request is answered once (or given a clean error), every batch line exactly once, P0 requests sent during the
failover are answered after it, and an upstream never sees more than its slots."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path

import httpx
import redis

from cluster_util import replicas, upstream
from laneway.testing import ServeProcess, StandInProcess

NAMES = ["r1", "r2", "r3"]
KILLS = 5
BATCH = 300


def batch_file() -> bytes:
    line = {
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": "m", "prompt": "b", "max_tokens": 20},
    }
    return b"".join(json.dumps({"custom_id": f"b{i:03d}", **line}).encode() + b"\n" for i in range(BATCH))


def leader_of(r: redis.Redis, prefix: str) -> str | None:
    raw = r.get(prefix + "leader")
    return raw.decode().rpartition("|")[0] if raw is not None else None


def test_killing_the_leader_loses_nothing(tmp_path: Path, redis_url: str) -> None:
    standin = StandInProcess(tmp_path / "standin.log", ("--slots", "2", "--ms-per-token", "2"))
    client = redis.Redis.from_url(redis_url)
    try:
        prefix = f"fo{time.monotonic_ns()}:"
        # (the load is at the engine's capacity: on a busy host the P3 queue's expected wait
        # passes max_wait_s and an arrival is refused 503 overloaded, as it should be; this
        # test asks for nothing lost, so no refusal by the wait)
        nowait = '[scheduler]\nmax_wait_s = "none"\n'
        with replicas(
            tmp_path, redis_url, NAMES, upstream("up", standin.url, 2), extra=nowait, prefix=prefix
        ) as reps:
            outcomes: list[tuple[str, int, str, str, float, float]] = []  # id, status, text, replica, t0, t1
            failovers: list[float] = []
            killed_at: dict[str, list[float]] = {n: [] for n in NAMES}
            batch_id: list[str] = []
            batch_ids: list[str] = []

            async def load(c: httpx.AsyncClient, stop: asyncio.Event) -> None:
                i = 0
                pending: set[asyncio.Task[None]] = set()

                async def one(n: int) -> None:
                    live = [x for x in NAMES if reps[x].proc.poll() is None]
                    name = live[n % len(live)]
                    url = reps[name].url + "/v1/completions"
                    prio = "P0" if n % 4 == 0 else "P3"
                    b = {"model": "m", "prompt": f"q{n}", "max_tokens": 20, "priority": prio}
                    t0 = time.monotonic()
                    try:
                        r = await c.post(url, json=b)
                        outcomes.append((f"q{n}", r.status_code, r.text, name, t0, time.monotonic()))
                    except httpx.TransportError as exc:  # its replica was the one killed
                        outcomes.append((f"q{n}", -1, repr(exc), name, t0, time.monotonic()))

                while not stop.is_set() and i < 2000:
                    t = asyncio.create_task(one(i))
                    pending.add(t)
                    t.add_done_callback(pending.discard)
                    i += 1
                    await asyncio.sleep(0.02)
                await asyncio.gather(*pending)

            async def go() -> None:
                async with httpx.AsyncClient(timeout=60) as c:
                    base = reps["r2"].url + "/v1"
                    f = await c.post(
                        base + "/files", files={"file": ("in.jsonl", batch_file())}, data={"purpose": "batch"}
                    )
                    made = await c.post(
                        base + "/batches",
                        json={
                            "input_file_id": f.json()["id"],
                            "endpoint": "/v1/completions",
                            "completion_window": "24h",
                        },
                    )
                    batch_id.append(made.json()["id"])
                    stop = asyncio.Event()
                    loader = asyncio.create_task(load(c, stop))
                    for _ in range(KILLS):
                        await asyncio.sleep(1.5)
                        name = leader_of(client, prefix)
                        assert name is not None
                        proc: ServeProcess = reps[name]
                        proc.kill()
                        killed = time.monotonic()
                        killed_at[name].append(killed)
                        while leader_of(client, prefix) in (None, name):
                            assert time.monotonic() - killed < 10, "no new leader"
                            await asyncio.sleep(0.05)
                        failovers.append(time.monotonic() - killed)
                        # it comes back as a standby (started off the loop: the load goes on)
                        reps[name] = await asyncio.to_thread(ServeProcess, proc.args, proc.log)
                    await asyncio.sleep(2.0)
                    stop.set()
                    await loader
                    deadline = time.monotonic() + 60
                    while True:
                        b = (await c.get(reps["r3"].url + f"/v1/batches/{batch_id[0]}")).json()
                        if b["status"] == "completed":
                            break
                        assert time.monotonic() < deadline, b
                        await asyncio.sleep(0.2)
                    if b["request_counts"]["failed"]:
                        errors = (
                            await c.get(reps["r3"].url + f"/v1/files/{b['error_file_id']}/content")
                        ).text
                        raise AssertionError(f"{b['request_counts']}: {errors[:600]}")
                    got = await c.get(reps["r3"].url + f"/v1/files/{b['output_file_id']}/content")
                    assert got.status_code == 200, (b, got.text[:300])
                    lines = got.text
                    assert all('"custom_id"' in x for x in lines.splitlines()), lines[:600]
                    batch_ids.extend(json.loads(x)["custom_id"] for x in lines.splitlines())

            asyncio.run(go())
    finally:
        stats = httpx.get(standin.url.removesuffix("/v1") + "/stats", timeout=5).json()
        standin.stop()
        client.close()
    assert stats["peak_requests"] <= 2, stats
    assert max(failovers) < 5.0, failovers  # a standby leads within 5 s
    assert sorted(batch_ids) == [f"b{i:03d}" for i in range(BATCH)]  # every line exactly once
    assert len(outcomes) > 200
    ids = [o[0] for o in outcomes]
    assert len(ids) == len(set(ids))  # each answered once
    for rid, status, text, name, t0, t1 in outcomes:
        if status == -1:  # only the clients of the replica killed under them lose their answer
            assert any(t0 - 0.1 <= k <= t1 + 0.1 for k in killed_at[name]), (rid, name, text)
        else:
            assert status == 200, (rid, status, text)
    p0_during = [o for o in outcomes if o[2].count('"priority":"P0"') and o[1] == 200]
    assert p0_during, "P0 requests were answered"


def test_a_dead_replicas_requests_free_their_slots(tmp_path: Path, redis_url: str) -> None:
    """Replica r2 holds every slot with long requests and is SIGKILLed: the leader frees
    those slots once r2 stops saying it lives, and r1's requests run; r2 restarted under
    the same name is a new replica (what the old one left is not its)."""
    standin = StandInProcess(tmp_path / "standin.log", ("--slots", "2", "--ms-per-token", "20"))
    client = redis.Redis.from_url(redis_url)
    prefix = f"dead{time.monotonic_ns()}:"
    try:
        with replicas(
            tmp_path, redis_url, ["r1", "r2"], upstream("up", standin.url, 2), prefix=prefix
        ) as reps:
            assert leader_of(client, prefix) == "r1"  # (started first)
            long = {"model": "m", "prompt": "x", "max_tokens": 5000, "priority": "P0", "stream": True}

            async def go() -> float:
                async with httpx.AsyncClient(timeout=60) as c:
                    hogs = [
                        asyncio.create_task(c.post(reps["r2"].url + "/v1/completions", json=long))
                        for _ in range(2)
                    ]
                    await asyncio.sleep(1.5)  # both slots are r2's now
                    reps["r2"].kill()
                    for h in hogs:
                        with contextlib.suppress(httpx.TransportError):
                            await h
                    t0 = time.monotonic()
                    while client.hlen(prefix + "reqs"):  # until the leader lets r2's requests go
                        assert time.monotonic() - t0 < 10.0, "r2's requests were never freed"
                        await asyncio.sleep(0.1)
                    r = await c.post(
                        reps["r1"].url + "/v1/completions",
                        json={"model": "m", "prompt": "y", "max_tokens": 3, "priority": "P0"},
                    )
                    assert r.status_code == 200, r.text
                    return time.monotonic() - t0

            took = asyncio.run(go())
            assert took < 10.0  # the slots came back (the liveness TTL, 3 s, and a reap)
            reps["r2"] = ServeProcess(reps["r2"].args, reps["r2"].log)
            r = httpx.post(
                reps["r2"].url + "/v1/completions",
                json={"model": "m", "prompt": "z", "max_tokens": 3},
                timeout=30,
            )
            assert r.status_code == 200, r.text
    finally:
        standin.stop()
        client.close()


def test_a_replica_paused_past_its_liveness_ends_what_it_had_in_flight_and_goes_on(
    tmp_path: Path, redis_url: str
) -> None:
    """r2 holds both slots with long requests and has a short one queued, then stops for
    longer than its liveness (SIGSTOP): the leader gives r2's slots away. Once it runs again,
    r2 ends all three with a clean 503 (rather than let its requests run on slots that are
    no longer theirs, or wait for decisions that will never come) and serves new ones."""
    standin = StandInProcess(tmp_path / "standin.log", ("--slots", "2", "--ms-per-token", "5"))
    client = redis.Redis.from_url(redis_url)
    prefix = f"pause{time.monotonic_ns()}:"
    try:
        with replicas(
            tmp_path, redis_url, ["r1", "r2"], upstream("up", standin.url, 2), prefix=prefix
        ) as reps:
            assert leader_of(client, prefix) == "r1"
            url = reps["r2"].url + "/v1/completions"

            async def go() -> list[int]:
                async with httpx.AsyncClient(timeout=60) as c:
                    hogs = [
                        asyncio.create_task(
                            c.post(url, json={"model": "m", "prompt": f"h{i}", "max_tokens": 4000})
                        )
                        for i in range(2)
                    ]
                    await asyncio.sleep(1.0)  # both slots are r2's
                    queued = asyncio.create_task(
                        c.post(url, json={"model": "m", "prompt": "q", "max_tokens": 3, "priority": "P1"})
                    )
                    await asyncio.sleep(0.5)
                    os.kill(reps["r2"].proc.pid, signal.SIGSTOP)
                    await asyncio.sleep(5.0)  # past its liveness (3 s) and a reap (1 s)
                    os.kill(reps["r2"].proc.pid, signal.SIGCONT)
                    done = await asyncio.wait_for(asyncio.gather(*hogs, queued), timeout=15.0)
                    return [r.status_code for r in done]

            statuses = asyncio.run(go())
            assert statuses == [503, 503, 503], statuses
            assert "taken for dead" in reps["r2"].log.read_text()
            r = httpx.post(url, json={"model": "m", "prompt": "z", "max_tokens": 3}, timeout=30)
            assert r.status_code == 200, r.text
    finally:
        standin.stop()
        client.close()
