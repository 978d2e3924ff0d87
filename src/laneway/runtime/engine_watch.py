"""What each upstream's engine says of itself, read at every probe that succeeds.

- its KV space in tokens (vLLM's ``vllm:cache_config_info``), where ``kv_tokens`` is not
  configured: the capacity of its prefix-cache index in the scheduler;
- its own gauges (requests running and waiting, KV use): the saturation gate sets how
  many requests it is sent at once (:mod:`laneway.runtime.saturation`);
- its prefix-cache counters (vLLM's ``vllm:prefix_cache_queries`` and
  ``vllm:prefix_cache_hits``, prompt tokens): the hit rate it reports since laneway
  first read them, beside the one laneway's placement expects
  (``laneway_worker_prefix_hit_ratio_reported`` and ``..._expected``; the dashboard).
  Counters that go back say the engine restarted: its cache is empty, and placement's
  index forgets what it was sent (as it does when a probe finds no engine there, or
  another one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from laneway.backends.base import EngineState, Worker
from laneway.runtime.metrics import Metrics
from laneway.runtime.saturation import QUICK_READ_S, Saturation
from laneway.runtime.scheduling import SchedulerPort

log = logging.getLogger("laneway.runtime")


@dataclass
class HitCount:
    """An engine's prefix-cache counters: the first reading and the latest."""

    queries0: float
    hits0: float
    queries: float
    hits: float

    def update(self, queries: float, hits: float) -> bool:
        """Take a reading; whether the counters went back (its engine restarted: counting
        anew, and its cache is empty)."""
        restarted = queries < self.queries or hits < self.hits
        if restarted:
            self.queries0 = self.hits0 = 0.0
        self.queries, self.hits = queries, hits
        return restarted

    @property
    def ratio(self) -> float | None:
        """Hits over queries since the first reading (``None``: nothing asked since), within
        0 and 1 whatever the engine's counters say."""
        asked = self.queries - self.queries0
        return min(max((self.hits - self.hits0) / asked, 0.0), 1.0) if asked > 0 else None


class EngineWatch:
    """The engines' own figures, for the scheduler (KV space, concurrency) and for people."""

    def __init__(
        self,
        workers: Mapping[str, Worker],
        kv_tokens: Mapping[str, int | None],
        saturation: Saturation,
        sched: Callable[[], SchedulerPort],
        metrics: Metrics,
        kick: Callable[[], None],
        take_back: Callable[[str, int], int],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self.workers = workers
        # each worker's KV space as the scheduler has it: configured, or as its engine says
        self.kv_tokens: dict[str, int | None] = {name: kv_tokens.get(name) for name in workers}
        self._kv_configured = {name for name, n in self.kv_tokens.items() if n is not None}
        self.saturation = saturation
        self._sched = sched  # (a replica's core may be replaced by its leader's)
        self.metrics = metrics
        self._kick = kick
        self._take_back = take_back  # (worker, n): runs that made nothing taken back; how many
        self._spawn = spawn  # (the runtime's: its tasks are tracked and ended with it)
        self._soon: set[str] = set()  # workers whose engine is to be read soon
        self.hits: dict[str, HitCount] = {}
        for name, window in saturation.windows.items():
            metrics.set_concurrency(name, window.limit)

    async def probed(self, name: str) -> None:
        """Worker ``name`` answered its probe: read what its engine says."""
        self.learnt(name)
        await self.read(name)

    async def read(self, name: str) -> None:
        """Read worker ``name``'s engine gauges: its prefix hits, and its window."""
        state = await self.workers[name].engine_state()
        if state is None:
            return
        self._count_hits(name, state)
        limit = self.saturation.observe(
            name, state, self.workers[name].capacity().busy, asyncio.get_running_loop().time()
        )
        if limit is not None:
            self._sched().set_slots(name, limit)
            self.metrics.set_concurrency(name, limit)
            self._kick()
        window = self.saturation.windows.get(name)
        if window is not None and window.take_back:
            n = self._take_back(name, window.take_back)
            if n:
                said = "1 request" if n == 1 else f"{n} requests"
                log.info("worker %s: %s waiting in its engine's queue taken back", name, said)

    def started(self, name: str, worker: Worker) -> None:
        """A run is starting on worker ``name``: where it now runs more than its engine was
        seen to run without queueing, read the engine soon."""
        window = self.saturation.windows.get(name)
        if window is None or name in self._soon or not window.unproven(worker.capacity().busy + 1):
            return
        self._soon.add(name)
        asyncio.get_running_loop().call_later(QUICK_READ_S, self._read_soon, name)

    def _read_soon(self, name: str) -> None:
        self._spawn(self._quick(name))

    async def _quick(self, name: str) -> None:
        try:
            if name in self.workers:
                await self.read(name)
        except Exception:  # (an aid, as at a probe: a failure reads nothing)
            log.debug("worker %s: a quick read of its engine failed", name, exc_info=True)
        finally:
            self._soon.discard(name)

    def learnt(self, name: str) -> None:
        """What the worker learnt of its engine reaches the scheduler: its KV space, where
        not configured."""
        if name in self._kv_configured:
            return
        caps = self.workers[name].capabilities()
        kv = caps.get("kv_tokens") if caps else None
        if isinstance(kv, int) and kv > 0 and kv != self.kv_tokens.get(name):
            self.kv_tokens[name] = kv
            self._sched().set_kv_tokens(name, kv)
            log.info("worker %s: its engine holds %d tokens of KV cache", name, kv)

    def _count_hits(self, name: str, state: EngineState) -> None:
        if state.prefix_queries is None or state.prefix_hits is None:
            return
        count = self.hits.get(name)
        if count is None:
            q, h = state.prefix_queries, state.prefix_hits
            self.hits[name] = HitCount(q, h, q, h)
            return
        if count.update(state.prefix_queries, state.prefix_hits):
            self.cache_lost(name, "its prefix-cache counters went back: it restarted")
        ratio = count.ratio
        if ratio is not None:
            self.metrics.set_reported_hits(name, ratio)

    def cache_lost(self, name: str, why: str) -> None:
        """Worker ``name``'s engine holds none of the prompts it was sent (``why``): placement
        expects no prefix hit on it until it is sent them again."""
        self._sched().cache_lost(name)
        log.info("worker %s: its engine's prefix cache is taken as empty (%s)", name, why)

    def engine_back(self, name: str, why: str) -> None:
        """Worker ``name`` answers again after a probe found no engine of its model there:
        a fresh engine, whose counters are read anew from the next probe on."""
        self.hits.pop(name, None)
        self.cache_lost(name, why)

    def reported_hits(self) -> dict[str, float]:
        """Per worker whose engine counts them, the prefix hit rate it reports."""
        return {name: r for name, c in self.hits.items() if (r := c.ratio) is not None}
