"""The shared store of a cluster's replicas: :class:`RedisStore`, Redis's
:class:`~laneway.store.redis_db.RedisDB` run off the event loop (as SQLite's is:
:mod:`laneway.store.threaded`), with Redis's own errors made the store's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from laneway.store.base import StoreUnavailable
from laneway.store.threaded import ThreadedStore

T = TypeVar("T")


class RedisStore(ThreadedStore):
    """The shared store of several replicas: Redis (AOF on), keys under ``prefix``."""

    @classmethod
    async def open(cls, url: str, prefix: str = "laneway:", *, replicas: bool = False) -> RedisStore:
        """``replicas``: the owners of lines are replicas of a cluster whose liveness is in the
        same Redis: a line of one that stands still is not claimed again while its request
        may still run (:data:`~laneway.store.redis_lua.LUA_CLAIM`)."""
        from laneway.store.redis_db import CLAIM_GRACE_S, CLAIM_LONG_GRACE_S, RedisDB

        db = await asyncio.to_thread(RedisDB, url, prefix)
        if replicas:
            db.claim_grace = (CLAIM_GRACE_S, CLAIM_LONG_GRACE_S)
        return cls(db)

    async def _call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        import redis

        try:
            return await super()._call(fn, *args, **kw)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            raise StoreUnavailable(f"the shared store (Redis) cannot be reached: {exc}") from None
        except redis.ResponseError as exc:
            if str(exc).startswith(("LOADING", "BUSY", "READONLY", "MASTERDOWN", "TRYAGAIN")):
                raise StoreUnavailable(f"the shared store (Redis) is not ready: {exc}") from None
            raise
