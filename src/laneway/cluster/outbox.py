"""A replica's events to the leader: sent in order on the Redis stream ``PREFIX events``,
in pipelined batches, by one task.

Each stream entry holds up to :data:`EVENTS_PER_ENTRY` events (``b``: a list; the leader
applies them in order) and is numbered (``h``: the replica's home, ``n``: the number): one
sent again because its answer was lost (Redis went away meanwhile) is applied once.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import redis.asyncio as aioredis

from laneway.cluster.codec import Event, encode
from laneway.logs import Repeated

log = logging.getLogger("laneway.cluster")

EVENTS_PER_ENTRY = 64  # events sent in one stream entry (one command, one parse)


class Outbox:
    def __init__(self, client: aioredis.Redis, events_key: str, home: str, replica: str) -> None:
        self.r = client
        self.events_key = events_key
        self.home = home  # (the name the entries are numbered under)
        self.replica = replica  # (for the log)
        self._out: list[list[Any]] = []
        self._sending: tuple[int, bytes] | None = None  # the entry being sent (its number, its events)
        self._sent = 0  # entries numbered so far (the leader applies each number once)
        self._wake = asyncio.Event()
        self._failing = Repeated(log)  # (while Redis is away: a warning every 10 s, not each retry)

    def put(self, event: Event) -> None:
        """``event`` goes after those put before it."""
        self._out.append(encode(event))
        self._wake.set()

    @property
    def pending(self) -> bool:
        return bool(self._out) or self._sending is not None

    def reset(self, home: str) -> None:
        """The replica goes on under a new name: what it had not sent is moot."""
        self.home = home
        self._out, self._sending, self._sent = [], None, 0

    async def flush(self) -> None:
        """Send the next entry: the one whose answer was lost, else the next events."""
        if self._sending is None:
            batch = self._out[:EVENTS_PER_ENTRY]
            del self._out[: len(batch)]
            self._sent += 1
            self._sending = (self._sent, json.dumps(batch, separators=(",", ":")).encode())
        n, raw = self._sending
        await self.r.xadd(self.events_key, {"b": raw, "h": self.home, "n": n})
        self._sending = None

    async def run(self) -> None:
        """The sending task: every event, as it comes, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.pending:
                try:
                    await self.flush()
                    self._failing.ok("replica %s: sends events to the leader again", self.replica)
                except (aioredis.RedisError, OSError) as exc:
                    self._failing.warn("replica %s: cannot send events to the leader: %s", self.replica, exc)
                    await asyncio.sleep(0.2)

    async def drain(self) -> None:
        """Send what is left, until a send fails (the replica closes)."""
        while self.pending:
            try:
                await self.flush()
            except Exception:
                break
