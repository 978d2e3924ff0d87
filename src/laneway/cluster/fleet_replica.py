"""A cluster replica's part of the GPU fleet (the leader's: :mod:`laneway.cluster.fleet_book`).

- :class:`ClusterPlacing`: the replica that owns a node starts and stops the engines the
  leader decides there (the fleet's own code, :class:`~laneway.runtime.fleet.Fleet`) and
  tells the leader what became of them, as events; an engine ready is first written to
  ``PREFIX engines`` (its address, model, GPUs and owner), where every replica finds it.
- :class:`EngineDirectory`: a replica sent a request to an engine it did not start makes its
  worker from ``PREFIX engines`` before the dispatch is carried out, and drops it once the
  leader no longer lists the engine (evicted, gone).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

import redis.asyncio as aioredis

from laneway.cluster.fleet_messages import (
    AdapterFailed,
    AdapterTook,
    EngineGone,
    EngineReady,
    ModelFailing,
    Reload,
)
from laneway.cluster.remote import RemoteScheduler
from laneway.runtime.fleet import Fleet
from laneway.runtime.placing import EngineInfo, Started

if TYPE_CHECKING:
    from laneway.runtime.runtime import Runtime

log = logging.getLogger("laneway.cluster")


class ClusterPlacing:
    """What a replica's fleet tells the cluster's leader (:class:`~laneway.runtime.fleet.Placing`)."""

    def __init__(
        self, runtime: Runtime, remote: RemoteScheduler, client: aioredis.Redis, prefix: str
    ) -> None:
        self.rt = runtime
        self.remote = remote
        self.r = client
        self.key = prefix + "engines"
        self.running: dict[str, Started] = {}  # the engines ready here

    def hold(self, rid: str) -> None:
        """(The leader holds the preloads itself until they are ready.)"""

    async def ready(self, s: Started) -> None:
        self.running[s.rid] = s
        await self._publish(s.rid)
        self.remote.emit(EngineReady(s.rid, s.model, s.gpus, s.took_s, s.wake, s.preload))

    async def _publish(self, rid: str) -> None:
        s = self.running[rid]
        entry = {"home": self.remote.home, "model": s.model, "gpus": list(s.gpus), **s.engine.to_json()}
        try:
            await self.r.hset(self.key, rid, json.dumps(entry))
        except (aioredis.RedisError, OSError) as exc:  # (other replicas cannot reach it: only this one)
            log.error("the engine of %s could not be made known to the other replicas: %s", rid, exc)

    async def reborn(self) -> None:
        """This replica lives on under a new name: its engines are told again (the leader
        took them out of placement with the old name)."""
        for rid, s in list(self.running.items()):
            await self._publish(rid)
            self.remote.emit(EngineReady(rid, s.model, s.gpus, s.took_s))

    def _forget(self, rid: str) -> None:
        if self.running.pop(rid, None) is not None:
            self.rt.spawn(self._unpublish(rid))

    async def _unpublish(self, rid: str) -> None:
        try:
            await self.r.hdel(self.key, rid)
        except (aioredis.RedisError, OSError) as exc:  # (a new leader finds it and drops it)
            log.warning("the engine of %s stays listed: %s", rid, exc)

    def gone(self, rid: str, model: str) -> None:
        self._forget(rid)
        self.remote.emit(EngineGone(rid, model))

    def slept_away(self, rid: str, model: str) -> None:
        self.remote.emit(EngineGone(rid, model, True))

    def failed(self, model: str, reason: str, backoff_s: float) -> None:
        self.remote.emit(ModelFailing(model, reason, backoff_s))

    def adapter_took(self, adapter: str, seconds: float) -> None:
        self.remote.emit(AdapterTook(adapter, seconds))

    def adapter_failed(self, rid: str, adapter: str) -> None:
        self.remote.emit(AdapterFailed(rid, adapter))

    def reload(self, model: str) -> None:
        self.remote.emit(Reload(model))

    def evicted(self, rid: str) -> None:
        self._forget(rid)


class EngineDirectory:
    """The workers of the fleet's engines that other replicas started."""

    def __init__(self, runtime: Runtime, fleet: Fleet, client: aioredis.Redis, prefix: str) -> None:
        self.rt = runtime
        self.fleet = fleet
        self.r = client
        self.key = prefix + "engines"
        self.added: set[str] = set()

    def knows(self, worker: str) -> bool:
        return worker in self.rt.workers

    async def fetch(self, worker: str) -> None:
        """Make the worker of engine ``worker`` (as ``PREFIX engines`` lists it)."""
        if worker in self.rt.workers:
            return
        try:
            raw = await self.r.hget(self.key, worker)
            if raw is None:
                raise LookupError("it is not listed")
            e = json.loads(raw)
            model = str(e["model"])
            info = EngineInfo(str(e["url"]), str(e["served"]), int(e["slots"]), tuple(e.get("adapters", ())))
        except (aioredis.RedisError, OSError, LookupError, ValueError, TypeError) as exc:
            log.error("the engine of %s cannot be reached from here: %s", worker, exc)
            return
        if worker in self.rt.workers:  # (made meanwhile)
            return
        made = Fleet.worker_of(worker, model, info, elsewhere=True)
        self.fleet.add_worker(worker, made, model, info.served)
        self.added.add(worker)
        await self.rt.prober.add(worker)

    def listed(self, engines: set[str]) -> None:
        """The engines the leader places on now: the workers of the others go, once they run
        nothing here."""
        for rid in sorted(self.added - engines):
            if not self.fleet.runs_on(rid):
                self.added.discard(rid)
                self.rt.spawn(self.fleet.remove_worker(rid))
