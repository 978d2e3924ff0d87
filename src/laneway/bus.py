"""The bus the replicas of a cluster share, and their store: a Redis server, or one in this
very process — the cluster's test seam, as dramatiq's ``StubBroker`` is for its brokers.

``redis://HOST:PORT/DB`` (``rediss://``, ``unix://``) connects to a Redis server;
``memory://NAME`` to the in-process server a test provided under that name (:func:`provide`;
shared by every client of that name in the process, from any thread or event loop; the
tests' is fakeredis, its Lua run by Lua itself through lupa: the same commands, the same
Lua scripts), so the replicas of a test run in one process on one bus without a
``redis-server``, in seconds. The cluster's code sees one client type either way
(``redis.asyncio.Redis``, or ``redis.Redis`` for the store, which runs on a thread) and never
knows which it has.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis

MEMORY = "memory"


@dataclass(frozen=True)
class InProcessBus:
    """A bus in this process, as a test provides it (``tests``: fakeredis' server, its Lua by
    lupa): a new asyncio client of it, and a new blocking one."""

    connect: Callable[[], aioredis.Redis]
    connect_sync: Callable[[], redis.Redis]


_buses: dict[str, InProcessBus] = {}  # memory://NAME -> the bus provided under NAME
_lock = threading.Lock()


class BusUnavailable(RuntimeError):
    """A ``memory://`` URL that names no bus of this process."""


def _name(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc or parts.path


def provide(url: str, bus: InProcessBus) -> None:
    """``memory://NAME`` (``url``) is ``bus`` from now on, for every client of this process."""
    with _lock:
        _buses[_name(url)] = bus


def forget(url: str) -> None:
    """``memory://NAME`` names no bus any more."""
    with _lock:
        _buses.pop(_name(url), None)


def _in_process(url: str) -> InProcessBus:
    with _lock:
        bus = _buses.get(_name(url))
    if bus is None:
        raise BusUnavailable(
            f"{url}: no bus of that name in this process (memory:// buses are made by tests)"
        )
    return bus


def connect(url: str, *, timeout_s: float = 10.0, connect_timeout_s: float = 10.0) -> aioredis.Redis:
    """An asyncio client of the bus at ``url`` (replies as bytes)."""
    if urlsplit(url).scheme == MEMORY:
        return _in_process(url).connect()
    return aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=connect_timeout_s)


def connect_sync(url: str, *, timeout_s: float = 10.0, connect_timeout_s: float = 5.0) -> redis.Redis:
    """A blocking client of the bus at ``url`` (replies as bytes), for a thread of its own."""
    if urlsplit(url).scheme == MEMORY:
        return _in_process(url).connect_sync()
    return redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=connect_timeout_s)
