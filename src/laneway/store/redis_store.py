"""The shared store of a cluster's replicas: :class:`RedisStore`, Redis's
:class:`~laneway.store.redis_db.RedisDB` run off the event loop (as SQLite's is:
:mod:`laneway.store.threaded`), with Redis's own errors made the store's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from laneway.store.base import StoreUnavailable
from laneway.store.data_dir import claim, release
from laneway.store.threaded import ThreadedStore

T = TypeVar("T")

AWAY_HOLD_S = 2.0  # once Redis stood still past a timeout, calls fail at once this long (the Retry-After)


class RedisStore(ThreadedStore):
    """The shared store of several replicas: Redis (AOF on), keys under ``prefix``.

    A call that finds Redis standing still (no answer within the socket's timeout) makes
    the calls queued behind it, and those for :data:`AWAY_HOLD_S` after, fail at once:
    each would wait out the timeout again (a file or batch route answered its 503 after
    10–20 s). A connection refused needs no such hold: it fails at once, and a Redis
    restarted is used by the next call."""

    def __init__(self, db: Any, lock: int | None = None) -> None:
        super().__init__(db)
        self._away_until = 0.0  # (monotonic)
        self._away = ""
        self._lock = lock  # the replica's data directory's, held while it runs

    @classmethod
    async def open(
        cls, url: str, prefix: str = "laneway:", *, replicas: bool = False, data_dir: Path | None = None
    ) -> RedisStore:
        """``replicas``: the owners of lines are replicas of a cluster whose liveness is in the
        same Redis: a line of one that stands still is not claimed again while its request
        may still run (:data:`~laneway.store.redis_lua.LUA_CLAIM`). ``data_dir``: the
        replica's own (its generation, its journal), claimed as a single server's is."""
        from laneway.store.redis_db import CLAIM_GRACE_S, CLAIM_LONG_GRACE_S, RedisDB

        lock = claim(data_dir) if data_dir is not None else None
        try:
            db = await asyncio.to_thread(RedisDB, url, prefix)
        except BaseException:
            if lock is not None:
                release(lock)
            raise
        if replicas:
            db.claim_grace = (CLAIM_GRACE_S, CLAIM_LONG_GRACE_S)
        return cls(db, lock)

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            if self._lock is not None:
                release(self._lock)
                self._lock = None

    async def _call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        import redis

        self._check_away()
        try:
            return await super()._call(self._on_thread, fn, *args, **kw)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            raise StoreUnavailable(f"the shared store (Redis) cannot be reached: {exc}") from None
        except redis.ResponseError as exc:
            if str(exc).startswith(("LOADING", "BUSY", "READONLY", "MASTERDOWN", "TRYAGAIN")):
                raise StoreUnavailable(f"the shared store (Redis) is not ready: {exc}") from None
            raise

    def _check_away(self) -> None:
        if time.monotonic() < self._away_until:
            raise StoreUnavailable(f"the shared store (Redis) cannot be reached: {self._away}")

    def _on_thread(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """``fn`` on the store's thread, unless a call before it found Redis away just now."""
        import redis

        self._check_away()
        try:
            return fn(*args, **kw)
        except redis.TimeoutError as exc:  # (refused at once needs no hold: Redis may be back next)
            self._away, self._away_until = str(exc), time.monotonic() + AWAY_HOLD_S
            raise
