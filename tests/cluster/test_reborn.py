"""A replica taken for dead goes on under a new name, with nothing: the requests it had in
flight are ended here, before anything that may fail (a Redis error as it comes back left
them known to nobody, and their clients waited for ever)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from laneway.bus import connect
from laneway.cluster.remote import RemoteScheduler
from laneway.core import Request

NAMES = ("P0", "P1", "P2", "P3")


@pytest.mark.parametrize("redis_fails", [False, True], ids=["redis-well", "redis-fails-as-it-comes-back"])
def test_a_replica_taken_for_dead_ends_its_requests_whatever_redis_does(
    memory_bus: str, redis_fails: bool
) -> None:
    async def go() -> tuple[list[tuple[str, list[str]]], str, str]:
        prefix = f"reborn{uuid.uuid4().hex[:8]}:"
        client = connect(memory_bus)
        remote = RemoteScheduler(client, prefix, "a", NAMES, kick=lambda: None)
        ended: list[tuple[str, list[str]]] = []
        remote.on_reborn = lambda home, ids: ended.append((home, ids))
        for i in range(2):
            assert remote.submit(Request(f"r{i}", priority=1, arrival_s=0.0), 0.0) is None
        old = remote.home
        if redis_fails:
            real = remote.r.set

            async def set_fails(name: str, *args: Any, **kw: Any) -> Any:
                if name.startswith(prefix + "alive:"):
                    raise RedisConnectionError("Connection reset by peer")
                return await real(name, *args, **kw)

            remote.r.set = set_fails  # type: ignore[method-assign]
        try:
            await remote._reborn()
        except RedisConnectionError:  # (the heartbeat takes it, and tries again later)
            assert redis_fails
        await client.aclose()
        return ended, old, remote.home

    ended, old, home = asyncio.run(go())
    assert home != old and home.startswith("a.")
    assert ended == [(home, ["r0", "r1"])]
