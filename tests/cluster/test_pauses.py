"""A replica paused past its liveness (SIGSTOP: a GC pause, a throttled container) is taken
for dead, but what it had running still runs at the engine while it stands still: its slots
stay held until the engine shows those requests gone (the stand-in, as vLLM, counts them
in /metrics), so an upstream never runs more than its slots; once it runs again, it ends
what it had in flight and starts nothing the leader gave away."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import redis

from cluster_util import replicas, upstream
from laneway.testing import StandInProcess

HOG = {"model": "m", "max_tokens": 4000, "priority": "P3"}  # 80 s at 20 ms a token


def leader_of(r: redis.Redis, prefix: str) -> str | None:
    raw = r.get(prefix + "leader")
    return raw.decode().rpartition("|")[0] if raw is not None else None


@pytest.mark.parametrize("paused", ["r1", "r2"], ids=["the-leader", "a-replica"])
def test_a_paused_replicas_slots_stay_held_until_its_requests_are_gone(
    tmp_path: Path, redis_url: str, paused: str
) -> None:
    standin = StandInProcess(tmp_path / "standin.log", ("--slots", "2", "--ms-per-token", "20"))
    client = redis.Redis.from_url(redis_url)
    prefix = f"hold{time.monotonic_ns()}:"
    other = "r2" if paused == "r1" else "r1"
    try:
        with replicas(
            tmp_path, redis_url, ["r1", "r2"], upstream("up", standin.url, 2), prefix=prefix
        ) as reps:
            assert leader_of(client, prefix) == "r1"  # (started first)

            async def go() -> tuple[list[int], list[int], float]:
                async with httpx.AsyncClient(timeout=90) as c:
                    hogs = [
                        asyncio.create_task(
                            c.post(reps[paused].url + "/v1/completions", json={**HOG, "prompt": f"#h{i}# x"})
                        )
                        for i in range(2)
                    ]
                    await asyncio.sleep(1.5)  # both slots run the paused one's requests
                    pid = reps[paused].proc.pid
                    os.kill(pid, signal.SIGSTOP)
                    try:
                        await asyncio.sleep(5.0)  # past its liveness (3 s): taken for dead
                        short = [
                            asyncio.create_task(
                                c.post(
                                    reps[other].url + "/v1/completions",
                                    json={
                                        "model": "m",
                                        "prompt": f"#s{i}# y",
                                        "max_tokens": 5,
                                        "priority": "P0",
                                    },
                                )
                            )
                            for i in range(2)
                        ]
                        await asyncio.sleep(3.0)  # they wait: the engine still runs the paused one's
                        waited = [t.done() for t in short]
                    finally:
                        os.kill(pid, signal.SIGCONT)
                    assert waited == [False, False], "started on slots the engine still used"
                    t0 = time.monotonic()
                    got = await asyncio.wait_for(asyncio.gather(*short), timeout=30)
                    took = time.monotonic() - t0
                    ended = await asyncio.wait_for(asyncio.gather(*hogs), timeout=30)
                    return [r.status_code for r in got], [r.status_code for r in ended], took

            short, hogs, took = asyncio.run(go())
            stats = httpx.get(standin.url.removesuffix("/v1") + "/stats", timeout=5).json()
            assert short == [200, 200]
            assert hogs == [503, 503]  # ended once it ran again: its slots were not its own
            assert took < 15, took  # the short ones started once the engine had let the hogs go
            assert stats["peak_requests"] <= 2, stats
            assert "taken for dead" in reps[paused].log.read_text()
    finally:
        standin.stop()
        client.close()


def test_a_paused_runners_batch_lines_are_not_run_twice_at_once(tmp_path: Path) -> None:
    """Replicas run lines of one batch (12 s each, leases of 2 s) with slots to spare; the one
    that runs them stands still for 7 s. Its lines' leases run out, but they are claimed
    again only once it was taken for dead and the engine shows its requests gone (they ran on while it stood
    still): no line runs twice at once, each is answered once, the engine stays within its
    slots."""
    from laneway.fault_harness import cluster

    with cluster(tmp_path, replicas=2, upstreams=1, slots=8, ms_per_token=20, lease_s=2) as c:
        batch = c.create_batch(6, max_tokens=600)
        time.sleep(2.0)  # the runners run the lines now
        owners = c.line_owners(batch)
        paused = max(owners, key=lambda n: owners[n])
        c.pause(paused, 7.0)
        b = c.wait_batch(batch, timeout_s=120)
        ids = c.output_ids(b.get("output_file_id"))
        twice = c.twice_at_once()
        peaks = c.peaks()
        dead = [line for line in c.replicas[paused].text().splitlines() if "taken for dead" in line]
    assert dead, f"{paused} was not taken for dead: the test did not test"
    assert b.get("status") == "completed", b
    assert sorted(ids) == [f"b{i:05d}" for i in range(6)]
    assert twice == [], twice
    assert peaks[0] <= 8, peaks
