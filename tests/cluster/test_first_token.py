"""In a cluster the leader's core places by prefix cache: a replica tells it when each
request's first token came, so the leader stops counting that prompt as prefill still
ahead on its worker (else a worker would look busier than it is until the request ends)."""

from __future__ import annotations

import asyncio
import time
import uuid

from laneway.bus import connect
from laneway.cluster.leader import Leader
from laneway.cluster.lease import Lease
from laneway.cluster.remote import RemoteScheduler
from laneway.core import Dispatch, Request, SchedulerConfig, WorkerSpec

NAMES = ("P0", "P1", "P2", "P3")


async def until(check: object, what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


def test_the_leader_hears_of_a_requests_first_token(memory_bus: str) -> None:
    async def go() -> None:
        prefix = f"first{uuid.uuid4().hex[:8]}:"
        client = connect(memory_bus)
        a = RemoteScheduler(client, prefix, "a", NAMES, kick=lambda: None)
        lease = Lease(client, prefix, "a", ttl_s=30)
        workers = [WorkerSpec("w0", slots=2), WorkerSpec("w1", slots=2)]
        leader = Leader(
            client,
            prefix,
            "a",
            a.home,
            workers,
            SchedulerConfig(placement="prefix"),
            "laneway",
            ["m"],
            a.deliver,
        )
        leader.use(lease)
        await a.start()
        token = await lease.acquire()
        assert token is not None
        await leader.lead(token)
        try:
            blocks = tuple(range(100, 140))  # 40 blocks no engine holds
            req = Request("r1", 1, time.monotonic(), model="m", prompt_tokens=1_300, prefix=blocks)
            assert a.submit(req, time.monotonic()) is None
            got: list[Dispatch] = []
            await until(
                lambda: got.extend(d for d in a.schedule(time.monotonic()) if isinstance(d, Dispatch)) or got,
                "dispatched",
            )
            core = leader.core
            assert core is not None
            w = core.workers[got[0].worker_id]
            assert w.prefill == 1_300  # (its uncached prompt, until its first token)
            a.first_token("r1", time.monotonic())
            await until(lambda: w.prefill == 0, "the leader heard of its first token")
            assert core.get("r1").prefilled
            a.finished("r1", time.monotonic(), tokens=5)
        finally:
            await leader.lose()
            await a.close()
            await client.aclose()

    asyncio.run(go())
