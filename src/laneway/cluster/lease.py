"""Leadership among replicas: one lease in Redis, with a fencing token.

The lease is the key ``PREFIX leader`` holding ``REPLICA|TOKEN``, set with
``SET NX PX`` semantics and renewed by its holder (a Lua script compares the
value first, so only the holder renews or releases it). Each acquisition takes
the next number of ``PREFIX leader:epoch``: with the data set's generation
(``PREFIX gen``, :mod:`laneway.cluster.generation`) that number is the fencing
token, ``GENERATION:EPOCH``.

A leader's every write goes through :meth:`Lease.fenced`: a Lua script that
runs the write only while the lease still holds the leader's name and token. A
leader that stalled past its lease (whether or not another took over since), or
one of before a Redis restart from an older copy of its data (epochs counted
again from that copy, under the same generation, until the loss is seen), is
refused — two leaders never both write, even if both believe they lead for a
moment.

Replicas may rank for the lease (``[cluster] leader_priority``): every try
and renewal also says "I am a candidate of priority N" for one lease period,
nobody takes a free lease while a live candidate outranks it, and a holder
outranked by a live candidate hands the lease over at its next renewal. So a
replica set apart for scheduling (one that clients are not sent to) leads
while it lives, and any other replica takes over when it dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from laneway.cluster import tasks
from laneway.cluster.redis_io import text

log = logging.getLogger("laneway.cluster")

# Candidates: ZSET PREFIX leader:prio (replica -> its priority) and ZSET PREFIX leader:seen
# (replica -> until when, ms), refreshed by every try and renewal. KEYS lease, epoch/prio, ...
_CANDIDATE = """
local function stand(prio_key, seen_key, me, priority, ttl)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', seen_key, '-inf', now)) do
    redis.call('ZREM', prio_key, gone)
    redis.call('ZREM', seen_key, gone)
  end
  redis.call('ZADD', prio_key, priority, me)
  redis.call('ZADD', seen_key, now + ttl, me)
  redis.call('PEXPIRE', prio_key, ttl * 4)
  redis.call('PEXPIRE', seen_key, ttl * 4)
  local top = redis.call('ZREVRANGE', prio_key, 0, 0, 'WITHSCORES')
  return tonumber(top[2]) > tonumber(priority)
end
"""
# KEYS lease, epoch, prio, seen, gen; ARGV replica, ttl_ms, priority. The token is the data
# set's generation and the epoch: a Redis restarted empty counts epochs from 1 again, but
# under another generation (laneway.cluster.generation), so no old token is ever valid again
_ACQUIRE = (
    _CANDIDATE
    + """
local outranked = stand(KEYS[3], KEYS[4], ARGV[1], ARGV[3], tonumber(ARGV[2]))
if redis.call('EXISTS', KEYS[1]) == 1 or outranked then return 0 end
local token = (redis.call('GET', KEYS[5]) or '') .. ':' .. redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. token, 'PX', ARGV[2])
return token
"""
)
# KEYS lease, prio, seen; ARGV value, ttl_ms, replica, priority. 1: renewed; 0: not ours;
# 2: handed over (a live candidate of a higher priority takes it next)
_RENEW = (
    _CANDIDATE
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if stand(KEYS[2], KEYS[3], ARGV[3], ARGV[4], tonumber(ARGV[2])) then
  redis.call('DEL', KEYS[1])
  return 2
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
)
_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""


class NotLeader(Exception):
    """A fenced write was refused: another replica holds the lease now."""


@dataclass(frozen=True)
class Holder:
    replica: str
    token: str


class Lease:
    """One replica's view of the leader lease."""

    def __init__(
        self, client: aioredis.Redis, prefix: str, replica: str, ttl_s: float = 3.0, priority: int = 1
    ) -> None:
        if "|" in replica:
            raise ValueError("a replica name may not contain '|'")
        self.r = client
        self.key = prefix + "leader"
        self.epoch_key = prefix + "leader:epoch"
        self.gen_key = prefix + "gen"
        self.cand_keys = [prefix + "leader:prio", prefix + "leader:seen"]
        self.replica = replica
        self.priority = priority
        self.handed_over = False  # (the last renewal gave the lease to a candidate of a higher priority)
        self.ttl_ms = max(1, round(ttl_s * 1000))
        self.token: str | None = None  # ours while we believe we lead ("GENERATION:EPOCH")
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    @property
    def value(self) -> str:
        return f"{self.replica}|{self.token}"

    async def acquire(self) -> str | None:
        """Take the lease if nobody holds it and no live candidate has a higher priority;
        our fencing token, or ``None``."""
        got = await self._acquire(
            keys=[self.key, self.epoch_key, *self.cand_keys, self.gen_key],
            args=[self.replica, self.ttl_ms, self.priority],
        )
        self.token = got.decode() if isinstance(got, bytes) else None
        return self.token

    async def renew(self) -> bool:
        """Extend our lease; ``False`` (and we no longer lead) if it is not ours any more."""
        if self.token is None:
            return False
        got = int(
            await self._renew(
                keys=[self.key, *self.cand_keys], args=[self.value, self.ttl_ms, self.replica, self.priority]
            )
        )
        if got == 1:
            return True
        self.handed_over = got == 2
        self.token = None
        return False

    async def release(self) -> None:
        if self.token is not None:
            await self._release(keys=[self.key], args=[self.value])
            self.token = None

    async def withdraw(self) -> None:
        """No longer a candidate (this replica is stopping)."""
        await self.r.zrem(self.cand_keys[0], self.replica)
        await self.r.zrem(self.cand_keys[1], self.replica)

    async def holder(self) -> Holder | None:
        raw = await self.r.get(self.key)
        if raw is None:
            return None
        replica, _, token = text(raw).rpartition("|")
        return Holder(replica, token)

    def fenced(self, body: str) -> Callable[[Sequence[str], Sequence[Any]], Awaitable[Any]]:
        """A write that runs only under our token: ``body`` is Lua using ``KEYS``/``ARGV``
        after the first of each (the epoch key and our token), and its result is returned.
        Calling it raises :class:`NotLeader` once the epoch moved on."""
        script = self.r.register_script(
            "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {err = 'not leader'} end\n"
            "local KEYS, ARGV = {unpack(KEYS, 2)}, {unpack(ARGV, 2)}\n" + body
        )

        async def run(keys: Sequence[str], args: Sequence[Any]) -> Any:
            if self.token is None:
                raise NotLeader(f"{self.replica} does not lead")
            try:
                return await script(keys=[self.key, *keys], args=[self.value, *args])
            except aioredis.ResponseError as exc:
                if "not leader" in str(exc):
                    self.token = None
                    raise NotLeader(f"{self.replica} lost the lease") from None
                raise

        return run


class Campaign:
    """Keeps trying for the lease and, while held, renews it; calls ``on_lead(token)`` on
    becoming leader and ``on_lose()`` on losing it (renewal refused or Redis unreachable
    for longer than the lease)."""

    def __init__(
        self,
        lease: Lease,
        on_lead: Callable[[str], Awaitable[None]],
        on_lose: Callable[[], Awaitable[None]],
        every_s: float | None = None,
    ) -> None:
        self.lease = lease
        self.on_lead = on_lead
        self.on_lose = on_lose
        self.every_s = every_s if every_s is not None else lease.ttl_ms / 3000
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def step_down(self) -> None:
        """Give the lease up now (another replica, or this one, takes it and rebuilds)."""
        if self.lease.token is not None:
            with contextlib.suppress(Exception):
                await self.lease.release()
            self.lease.token = None
            await self.on_lose()

    async def close(self) -> None:
        await tasks.stop(self._task)
        with contextlib.suppress(Exception):
            await self.lease.withdraw()
        if self.lease.token is not None:
            with contextlib.suppress(Exception):
                await self.lease.release()
            await self.on_lose()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        renewed = loop.time()
        while True:
            try:
                if self.lease.token is None:
                    token = await self.lease.acquire()
                    if token is not None:
                        renewed = loop.time()
                        log.info("replica %s leads (fencing token %s)", self.lease.replica, token)
                        await self.on_lead(token)
                elif await self.lease.renew():
                    renewed = loop.time()
                elif self.lease.handed_over:
                    log.info(
                        "replica %s hands the lease to a replica of a higher priority", self.lease.replica
                    )
                    await self.on_lose()
                else:
                    log.warning("replica %s lost the lease", self.lease.replica)
                    await self.on_lose()
            except (aioredis.RedisError, OSError) as exc:
                if self.lease.token is not None and loop.time() - renewed > self.lease.ttl_ms / 1000:
                    self.lease.token = None
                    log.warning(
                        "replica %s: Redis unreachable past the lease (%s); not leading",
                        self.lease.replica,
                        exc,
                    )
                    await self.on_lose()
            except asyncio.CancelledError:
                raise
            except Exception:  # (becoming leader failed: let another replica, or a later try, lead)
                log.exception("replica %s: leading failed", self.lease.replica)
                with contextlib.suppress(Exception):
                    await self.lease.release()
                await self.on_lose()
            await asyncio.sleep(self.every_s)
