"""A Redis that stands still (SIGSTOP) costs one call its socket's timeout: the calls
queued behind it on the store's thread, and those for a moment after, are answered
``StoreUnavailable`` at once (each waited out the timeout in turn: a file route's 503
came after 10–20 s). Once the moment is over a call tries again, and Redis back serves it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from laneway.store import StoreUnavailable, redis_db, redis_store
from laneway.store.redis_store import RedisStore
from laneway.testing import redis_process


def test_calls_behind_one_that_found_redis_away_fail_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_db, "SOCKET_TIMEOUT_S", 1.0)
    monkeypatch.setattr(redis_store, "AWAY_HOLD_S", 1.0)

    async def main(server: Any) -> None:
        store = await RedisStore.open(server.url, prefix="away:")
        other = await RedisStore.open(server.url, prefix="away2:")
        reached: list[float] = []
        listing = store.db.list_files

        def counted(*args: Any, **kw: Any) -> Any:
            reached.append(time.monotonic())
            return listing(*args, **kw)

        store.db.list_files = counted
        try:
            assert (await store.list_files("t", limit=5)) == ([], False)
            server.pause()
            try:
                results = await asyncio.gather(
                    *(store.list_files("t", limit=5) for _ in range(4)), return_exceptions=True
                )
                assert all(isinstance(r, StoreUnavailable) for r in results), results
                assert len(reached) == 2  # the call before the pause, and the first after it alone
                with pytest.raises(StoreUnavailable, match="cannot be reached"):
                    await store.list_files("t", limit=5)  # (at once: not sent)
                assert len(reached) == 2
                with pytest.raises(StoreUnavailable):
                    await other.list_files("t", limit=5)
                await other.close()  # (during its hold: it closes all the same)
                assert other._pool._shutdown  # type: ignore[attr-defined]
            finally:
                server.unpause()
            for _ in range(50):  # (bounded: the hold is 1 s here)
                try:
                    assert (await store.list_files("t", limit=5)) == ([], False)
                    break
                except StoreUnavailable:
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError("Redis back was not used again")
        finally:
            await store.close()

    with redis_process(tmp_path) as server:
        asyncio.run(main(server))


def test_a_replicas_data_directory_is_its_own_and_private(tmp_path: Path) -> None:
    """A cluster replica keeps its own state in its data directory (its generation, the
    journal of what was created through it): a second replica given the same one is
    refused, as a second single server is (three replicas of README's tour shared one
    journal); the directory and its files are its owner's only."""
    from laneway.cluster.journal import Journal
    from laneway.store import StoreError

    mine = tmp_path / "replica"

    async def main(server: Any) -> None:
        store = await RedisStore.open(server.url, prefix="dd:", data_dir=mine)
        try:
            with pytest.raises(StoreError, match="another laneway server is using the data directory"):
                await RedisStore.open(server.url, prefix="dd:", data_dir=mine)
            journal = Journal(mine)
            journal.record("file", "file-1", "t")
            assert (mine.stat().st_mode & 0o777, journal.path.stat().st_mode & 0o777) == (0o700, 0o600)
        finally:
            await store.close()
        again = await RedisStore.open(server.url, prefix="dd:", data_dir=mine)  # (let go at close)
        await again.close()

    with redis_process(tmp_path) as server:
        asyncio.run(main(server))
