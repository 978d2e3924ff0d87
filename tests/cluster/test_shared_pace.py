"""Replicas size requests with the pace every replica measured: the leader gathers the
observations and publishes them, so a replica that served nothing of a model yet does
not take its requests for the cost model's default (its refusals would differ)."""

from __future__ import annotations

import asyncio
import time
import uuid

from laneway.bus import connect
from laneway.cluster.leader import Leader
from laneway.cluster.lease import Lease
from laneway.cluster.remote import RemoteScheduler
from laneway.core import CostModel, SchedulerConfig, WorkerSpec
from laneway.generation import Job, SamplingParams
from laneway.runtime.sizing import Sizing

NAMES = ("P0", "P1", "P2", "P3")


def test_a_replica_takes_the_pace_another_measured(memory_bus: str) -> None:
    async def go() -> tuple[float, float, float]:
        prefix = f"pace{uuid.uuid4().hex[:8]}:"
        client = connect(memory_bus)
        a = RemoteScheduler(client, prefix, "a", NAMES, kick=lambda: None)
        b = RemoteScheduler(client, prefix, "b", NAMES, kick=lambda: None)
        costs = CostModel()
        sa, sb = a.share(Sizing(costs, 256)), b.share(Sizing(costs, 256))
        job = Job("x", "m", SamplingParams(max_tokens=500), prompt="hello")
        before = sb.service_s(job)
        lease = Lease(client, prefix, "a", ttl_s=30)
        leader = Leader(
            client,
            prefix,
            "a",
            a.home,
            [WorkerSpec("w", slots=2)],
            SchedulerConfig(),
            "laneway",
            ["m"],
            a.deliver,
        )
        leader.use(lease)
        await a.start()
        await b.start()
        token = await lease.acquire()
        assert token is not None
        await leader.lead(token)
        try:
            for _ in range(5):  # replica a served some: 1,000 tokens a second
                sa.observe("m", 1001, 1.0)
            deadline = time.monotonic() + 10
            while sb.decode_tokens_s.get("m") is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return before, sb.service_s(job), sa.service_s(job)
        finally:
            await leader.lose()
            await a.close()
            await b.close()
            await client.aclose()

    before, after, measured = asyncio.run(go())
    assert after == measured  # b sizes as a measured, without serving anything
    assert after < before / 10  # (the default pace is far slower than 1,000 tokens/s)
    assert abs(after - 0.5) < 0.1  # 500 tokens at 1,000/s (and a short prompt)
