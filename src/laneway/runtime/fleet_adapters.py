"""A live fleet's LoRA adapters: the core's ``LoadAdapter`` / ``UnloadAdapter`` carried out.

An adapter is loaded into (unloaded from) a running engine of its base
(:mod:`laneway.runtime.engine_adapters`), one call at a time per engine, in order; a
request placed there with it waits for its load (the worker's gate), and a load that
fails ends the requests waiting for it with 503 ``model_unavailable`` and backs the
adapter off as a failed launch does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from laneway.core import LoadAdapter, UnloadAdapter
from laneway.runtime import engine_adapters

if TYPE_CHECKING:
    from laneway.runtime.fleet import Fleet

log = logging.getLogger("laneway.fleet")


class FleetAdapters:
    """The adapter calls of ``fleet``'s engines, and each (replica, served name)'s last load."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        adapters = fleet.cfg.adapters
        self.names = {name: a.lora_name for name, a in adapters.items()}  # adapter -> served name
        self._calls: dict[str, asyncio.Lock] = {}  # replica -> its engine's adapter calls, in order
        self._loads: dict[tuple[str, str], asyncio.Task[None]] = {}

    def load(self, d: LoadAdapter) -> None:
        lora = self.names[d.adapter]
        task = asyncio.get_running_loop().create_task(self._load(d.replica_id, d.adapter, lora))
        task.add_done_callback(_retrieved)  # (its failure is told to the runs waiting for it)
        self._loads[d.replica_id, lora] = task

    def unload(self, d: UnloadAdapter) -> None:
        lora = self.names[d.adapter]
        self._loads.pop((d.replica_id, lora), None)  # (its next load is a new one)
        rt = self.fleet.rt
        rt.metrics.adapter_unloads.labels(d.adapter).inc()
        rt.spawn(self._unload(d.replica_id, d.adapter, lora))

    def gate(self, rid: str) -> Callable[[str], Awaitable[None]]:
        """What replica ``rid``'s worker awaits before a call: the load of the adapter it names."""

        async def gate(model: str) -> None:
            task = self._loads.get((rid, model))
            if task is not None:
                await asyncio.shield(task)

        return gate

    def forget(self, rid: str) -> None:
        """Replica ``rid``'s worker left: its loads and calls are no more."""
        for key in [k for k in self._loads if k[0] == rid]:
            del self._loads[key]
        self._calls.pop(rid, None)

    async def _load(self, rid: str, adapter: str, lora: str) -> None:
        fleet = self.fleet
        metrics = fleet.rt.metrics
        async with self._calls.setdefault(rid, asyncio.Lock()):
            engine = fleet.engines.get(rid)
            t0 = time.monotonic()
            try:
                if engine is None or rid not in fleet.rt.workers:
                    raise engine_adapters.AdapterFailed("its base's engine is gone")
                await engine_adapters.load(engine.url, lora, fleet.cfg.adapters[adapter].path)
            except engine_adapters.AdapterFailed as exc:
                metrics.adapter_loads.labels(adapter, "failed").inc()
                fleet.placing.adapter_failed(rid, adapter)
                fleet.back_off(adapter, f"{rid}: adapter {adapter!r} could not be loaded", str(exc))
                raise fleet.faults.unavailable(adapter) from None
        took = time.monotonic() - t0
        log.info("adapter %s loaded into %s in %.2f s", adapter, rid, took)
        fleet.faults.started(adapter)
        metrics.adapter_loads.labels(adapter, "loaded").inc()
        fleet.placing.adapter_took(adapter, took)

    async def _unload(self, rid: str, adapter: str, lora: str) -> None:
        async with self._calls.setdefault(rid, asyncio.Lock()):
            engine = self.fleet.engines.get(rid)
            if engine is None:
                return
            try:
                await engine_adapters.unload(engine.url, lora)
            except engine_adapters.AdapterFailed as exc:
                log.warning("adapter %s could not be unloaded from %s: %s", adapter, rid, exc)


def _retrieved(task: asyncio.Task[None]) -> None:
    """(A failed adapter load that no run waited for is not reported as never retrieved.)"""
    if not task.cancelled():
        task.exception()
