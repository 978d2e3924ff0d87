"""What a live fleet tells the placement that decided its loads (:class:`Placing`): the core
in this process (:class:`LocalPlacing`), or a cluster's leader
(:class:`~laneway.cluster.fleet_replica.ClusterPlacing`); and how a ready engine is reached
(:class:`EngineInfo`, :class:`Started`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from laneway.core import Scheduler
from laneway.core.decisions import apply
from laneway.core.gpu_placement import GpuPlacement

if TYPE_CHECKING:
    from laneway.runtime.runtime import Runtime

log = logging.getLogger("laneway.fleet")


class Placing(Protocol):
    """What the fleet tells the placement that decided its loads: the core in this process
    (:class:`LocalPlacing`), or a cluster's leader (:mod:`laneway.cluster.fleet_replica`)."""

    def hold(self, rid: str) -> None:
        """Preloaded replica ``rid`` takes no work until its engine is ready."""

    async def ready(self, s: Started) -> None:
        """A replica's engine is ready (loaded, or woken)."""

    def gone(self, rid: str, model: str) -> None:
        """Replica ``rid`` (of ``model``) is gone without an eviction (its launch failed, its
        engine died): its GPUs are free once nothing runs on it."""

    def slept_away(self, rid: str, model: str) -> None:
        """Replica ``rid``'s engine is gone while asleep (it could not sleep, or died)."""

    def failed(self, model: str, reason: str, backoff_s: float) -> None:
        """``model`` (or an adapter) could not be started: its requests are refused for
        ``backoff_s``."""

    def adapter_took(self, adapter: str, seconds: float) -> None:
        """A load of LoRA ``adapter`` took ``seconds``."""

    def adapter_failed(self, rid: str, adapter: str) -> None:
        """LoRA ``adapter`` could not be loaded into replica ``rid``."""

    def reload(self, model: str) -> None:
        """Preloaded ``model`` lost its replica: load one again where there is room."""

    def evicted(self, rid: str) -> None:
        """Replica ``rid``'s engine was stopped or put to sleep, as decided."""


@dataclass(frozen=True)
class EngineInfo:
    """A ready engine as every replica of a cluster reaches it."""

    url: str
    served: str  # the name the engine serves its model under
    slots: int
    adapters: tuple[str, ...] = ()  # the names its LoRA adapters are served under

    def to_json(self) -> dict[str, object]:
        return {"url": self.url, "served": self.served, "slots": self.slots, "adapters": list(self.adapters)}


@dataclass(frozen=True)
class Started:
    """Replica ``rid``'s engine (``model`` on ``gpus``), ready after ``took_s``: started with
    the server (``preload``), or woken from sleep (``wake``)."""

    rid: str
    model: str
    gpus: tuple[str, ...]
    engine: EngineInfo
    took_s: float
    preload: bool = False
    wake: bool = False


class LocalPlacing:
    """The fleet's placement in this process: its own core."""

    def __init__(self, runtime: Runtime, core: Scheduler, planner: GpuPlacement) -> None:
        self.rt = runtime
        self.core = core
        self.planner = planner

    def hold(self, rid: str) -> None:
        self.core.set_available(rid, False)

    async def ready(self, s: Started) -> None:
        self.core.load_took(s.model, s.took_s, wake=s.wake)
        if s.preload:
            self.core.set_available(s.rid, True)
        else:
            self.core.loaded(s.rid, self.rt.now())

    def gone(self, rid: str, model: str) -> None:
        replica = self.planner.replicas.get(rid)
        if replica is not None and not replica.worker.running:
            self.core.unloaded(rid, self.rt.now())

    def slept_away(self, rid: str, model: str) -> None:
        if rid in self.planner.asleep:
            self.core.unloaded(rid, self.rt.now())

    def failed(self, model: str, reason: str, backoff_s: float) -> None:
        """(This process refuses them itself.)"""

    def adapter_took(self, adapter: str, seconds: float) -> None:
        self.core.load_took(adapter, seconds)

    def adapter_failed(self, rid: str, adapter: str) -> None:
        if rid in self.planner.replicas:
            self.core.adapter_failed(rid, adapter, self.rt.now())

    def reload(self, model: str) -> None:
        rt = self.rt
        now = rt.now()
        decisions = self.core.reload(model, now)
        if decisions:
            log.info("starting preloaded %s again", model)
        apply(decisions, rt, now)

    def evicted(self, rid: str) -> None:
        """(The core evicted it itself.)"""
