"""The bus the replicas of a cluster share, and their store: a Redis server, or one in this
very process — the cluster's test seam, as dramatiq's ``StubBroker`` is for its brokers.

``redis://HOST:PORT/DB`` (``rediss://``, ``unix://``) connects to a Redis server;
``memory://NAME`` to an in-process server of that name (made on first use, shared by every
client of that name in the process, from any thread or event loop): the same commands, the
same Lua scripts (run by Lua itself, through ``fakeredis`` and ``lupa``, a test dependency),
so the replicas of a test run in one process on one bus without a ``redis-server``, in
seconds. The cluster's code sees one client type either way (``redis.asyncio.Redis``, or
``redis.Redis`` for the store, which runs on a thread) and never knows which it has.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis

MEMORY = "memory"

_servers: dict[str, Any] = {}  # memory://NAME -> its in-process server
_lock = threading.Lock()


class BusUnavailable(RuntimeError):
    """A ``memory://`` bus without the package that provides it."""


def _server(url: str) -> Any:
    try:
        import fakeredis
    except ImportError:  # pragma: no cover - (a test dependency: the dev extra has it)
        raise BusUnavailable(
            f"{url}: an in-process bus needs the fakeredis package: pip install 'fakeredis[lua]'"
        ) from None
    name = urlsplit(url).netloc or urlsplit(url).path
    with _lock:
        if name not in _servers:
            _servers[name] = fakeredis.FakeServer()
        return _servers[name]


def forget(url: str) -> None:
    """Drops the in-process server of ``url`` (its data is gone: as a Redis restarted empty)."""
    with _lock:
        _servers.pop(urlsplit(url).netloc or urlsplit(url).path, None)


def connect(url: str, *, timeout_s: float = 10.0, connect_timeout_s: float = 10.0) -> aioredis.Redis:
    """An asyncio client of the bus at ``url`` (replies as bytes)."""
    if urlsplit(url).scheme == MEMORY:
        from fakeredis import FakeAsyncRedis

        return FakeAsyncRedis(server=_server(url))
    return aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=connect_timeout_s)


def connect_sync(url: str, *, timeout_s: float = 10.0, connect_timeout_s: float = 5.0) -> redis.Redis:
    """A blocking client of the bus at ``url`` (replies as bytes), for a thread of its own."""
    if urlsplit(url).scheme == MEMORY:
        from fakeredis import FakeRedis

        return FakeRedis(server=_server(url))
    return redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=connect_timeout_s)
