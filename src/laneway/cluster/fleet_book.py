"""A cluster's GPU fleet as its leader keeps it: one core places models on the GPUs of every
node, and the replica that owns a node starts and stops the engines there.

Every replica has the same ``[fleet]`` and names its own node (``fleet.node``); it tells the
leader so (:class:`~laneway.cluster.fleet_messages.Owns`, at start and with each census). A node whose
owner is not known to live is *offline*: nothing is loaded there. The core's ``Load``,
``Evict``, ``LoadAdapter`` and ``UnloadAdapter`` go to the owner of the node they concern
(:meth:`FleetBook.route`); the owner reports back (:meth:`FleetBook.apply`): an engine ready
(written first to ``PREFIX engines``, where every replica finds its address), gone, an
adapter loaded or not, a preloaded model to load again.

A new leader builds its core afresh (the preloads out of placement until their owners say
they are ready) and adopts every engine ``PREFIX engines`` lists whose owner lives
(:meth:`FleetBook.adopt`). When an owner is taken for dead, its node goes offline and its
replicas leave placement; each is dropped once nothing runs on it (:meth:`FleetBook.settle`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from laneway.cluster.codec import encode
from laneway.cluster.fleet_messages import (
    AdapterFailed,
    AdapterTook,
    EngineGone,
    EngineReady,
    ModelFailing,
    Owns,
    Reload,
)
from laneway.cluster.redis_io import text_map
from laneway.config.fleet import FleetConfig
from laneway.core import ConfigError, Decision, Evict, LanewayError, Load, Reject, Scheduler
from laneway.core.config import SchedulerConfig
from laneway.core.decisions import LoadAdapter, UnloadAdapter
from laneway.core.gpu_placement import GpuPlacement
from laneway.core.policies import policy as policy_spec

log = logging.getLogger("laneway.cluster")

FLEET_EVENTS = (Owns, EngineReady, EngineGone, ModelFailing, AdapterTook, AdapterFailed, Reload)


class FleetBook:
    def __init__(self, fleet: FleetConfig, config: SchedulerConfig, policy: str) -> None:
        self.cfg = fleet
        self.config = config
        self.policy = policy
        self.node_of = {g.id: g.node for g in fleet.inventory.gpus}
        self.owners: dict[str, str] = {}  # node -> the home of the replica that owns it
        self.orphaned: set[str] = set()  # replicas whose owner is gone: dropped once idle
        self.started_by: dict[str, str] = {}  # replica -> the home of the replica that started its engine
        self.planner: GpuPlacement | None = None
        self.failing: dict[str, list[Any]] = {}  # model -> [reason, until (wall clock)]

    def core(self) -> Scheduler:
        """A new core over the fleet: its preloads placed, out of placement until ready."""
        planner = GpuPlacement(
            self.cfg.inventory,
            naive=policy_spec(self.policy).placement == "naive",
            switch_wait_s=self.cfg.switch_wait_s,
        )
        core = Scheduler([], self.config, self.policy, placement=planner)
        for rid in planner.replicas:
            core.set_available(rid, False)
        self.planner = planner
        self.owners = {}
        self.orphaned = set()
        self.started_by = {}
        core.set_offline(set(self.cfg.inventory.nodes))
        return core

    async def adopt(
        self, r: aioredis.Redis, prefix: str, core: Scheduler, alive: set[str], now: float
    ) -> None:
        """Take in the engines that run (``PREFIX engines``) where their owner lives; forget
        the others (their owner is gone, and its engines with it)."""
        planner = self.planner
        assert planner is not None
        listed = text_map(await r.hgetall(prefix + "engines"))
        stale: list[str] = []
        for rid, raw in sorted(listed.items()):
            try:
                e = json.loads(raw)
                home, model, gpus = str(e["home"]), str(e["model"]), tuple(str(g) for g in e["gpus"])
            except (ValueError, KeyError, TypeError):
                stale.append(rid)
                continue
            if home not in alive:
                stale.append(rid)
                continue
            if rid in planner.replicas:  # a preload, as this core placed it too
                core.set_available(rid, True)
                self.started_by[rid] = home
                continue
            try:
                core.adopt_replica(rid, model, gpus, now)
                self.started_by[rid] = home
            except ConfigError as exc:
                log.error("the engine of %s is not taken in (%s)", rid, exc)
                stale.append(rid)
        if stale:
            await r.hdel(prefix + "engines", *stale)
        if listed:
            log.info("%d engines of the fleet taken in", len(listed) - len(stale))

    # ------------------------------------------------------------------ owners
    def _owned(self, core: Scheduler) -> None:
        core.set_offline(set(self.cfg.inventory.nodes) - set(self.owners))

    def dead(self, homes: set[str], core: Scheduler) -> None:
        """Replicas ``homes`` are taken for dead: their nodes go offline and the replicas
        there leave placement (dropped once idle: :meth:`settle`)."""
        nodes = {n for n, h in self.owners.items() if h in homes}
        for n in nodes:
            del self.owners[n]
        self._owned(core)
        planner = self.planner
        assert planner is not None
        for rid, rep in [*planner.replicas.items(), *planner.asleep.items()]:
            if self.node_of[rep.gpus[0]] in nodes or self.started_by.get(rid) in homes:
                if rid in planner.replicas:
                    core.set_available(rid, False)
                self.orphaned.add(rid)
        if nodes:
            named = ", ".join(f"node {n}" for n in sorted(nodes))
            log.warning("%s: no replica starts engines there now (nothing is loaded there)", named)

    def settle(self, core: Scheduler, now: float) -> None:
        """Drop the orphaned replicas that run nothing now."""
        planner = self.planner
        assert planner is not None
        for rid in sorted(self.orphaned):
            rep = planner.replicas.get(rid)
            if rep is None and rid not in planner.asleep:
                self.orphaned.discard(rid)
            elif rep is None or not rep.worker.running:
                core.unloaded(rid, now)
                self.orphaned.discard(rid)

    # ------------------------------------------------------------------ decisions out
    def route(self, d: Load | Evict | LoadAdapter | UnloadAdapter) -> str | None:
        """The home of the replica that carries out ``d`` (None: no live owner)."""
        planner = self.planner
        assert planner is not None
        if isinstance(d, Load | Evict):
            gpus = d.gpu_ids
        else:
            rep = planner.replicas.get(d.replica_id)
            gpus = rep.gpus if rep is not None else ()
        return self.owners.get(self.node_of[gpus[0]]) if gpus else None

    def refusal(self, request_id: str, model: str | None, now: float) -> Reject | None:
        """Why a new request of ``model`` is refused now (its engine cannot be started), or None."""
        failing = self.failing.get(model or "")
        if failing is None or failing[1] <= now:
            return None
        back = max(math.ceil(failing[1] - now), 1)
        reason = str(failing[0]).splitlines()[0] if failing[0] else "its engine failed"
        return Reject(
            request_id, "model_unavailable", f"model {model!r} could not be started: {reason}", back, back
        )

    # ------------------------------------------------------------------ events in
    def apply(
        self,
        e: Any,
        core: Scheduler,
        now: float,
        out: list[tuple[str, list[Any]]],
        queued: Callable[[str], list[str]],
    ) -> list[Decision]:
        """An event of an owner applied to the core; decisions it makes (to apply).
        ``queued(model)``: the requests of ``model`` queued now."""
        planner = self.planner
        assert planner is not None
        kind = type(e)
        if kind is Owns:
            if self.owners.get(e.node) != e.home:
                log.info("node %s: engines started by %s", e.node, e.home)
            self.owners[e.node] = e.home
            self._owned(core)
        elif kind is EngineReady:
            self.failing.pop(e.model, None)
            owner = self.owners.get(self.node_of.get(e.gpus[0], "")) if e.gpus else None
            if owner is not None:
                self.started_by[e.replica] = owner
            core.load_took(e.model, e.took_s, wake=e.wake)
            self.orphaned.discard(e.replica)
            rep = planner.replicas.get(e.replica)
            if rep is None:  # (placed by a leader before this one, or as it fell: taken in)
                try:
                    core.adopt_replica(e.replica, e.model, e.gpus, now)
                except ConfigError as exc:
                    log.error("the engine of %s is stopped: %s", e.replica, exc)
                    if owner is not None:
                        out.append((owner, encode(Evict(e.replica, e.model, e.gpus))))
            elif rep.ready:
                core.set_available(e.replica, True)
            else:
                core.loaded(e.replica, now)
        elif kind is EngineGone:
            if e.asleep:
                if e.replica in planner.asleep:
                    core.unloaded(e.replica, now)
            else:
                rep = planner.replicas.get(e.replica)
                if rep is not None and not rep.worker.running:
                    core.unloaded(e.replica, now)
                elif rep is not None:  # (what runs there fails over; then it goes)
                    core.set_available(e.replica, False)
                    self.orphaned.add(e.replica)
        elif kind is ModelFailing:  # its requests are refused for a while, on every replica
            self.failing[e.model] = [e.reason, now + e.backoff_s]
            withdrawn: list[Decision] = []
            for rid in queued(e.model):
                r = self.refusal(rid, e.model, now)
                if r is not None:
                    with contextlib.suppress(LanewayError):
                        withdrawn.append(core.withdraw(rid, now, r.reason, r.message, r.retry_after_s))
            return withdrawn
        elif kind is AdapterTook:
            core.load_took(e.adapter, e.seconds)
        elif kind is AdapterFailed:
            if e.replica in planner.replicas:
                core.adapter_failed(e.replica, e.adapter, now)
        elif kind is Reload:
            return core.reload(e.model, now)
        return []
