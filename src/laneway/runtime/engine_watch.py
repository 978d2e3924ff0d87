"""What each upstream's engine says of itself, read at every probe that succeeds.

- its KV space in tokens (vLLM's ``vllm:cache_config_info``), where ``kv_tokens`` is not
  configured: the capacity of its prefix-cache index in the scheduler;
- its own gauges (requests running and waiting, KV use): the saturation gate sets how
  many requests it is sent at once (:mod:`laneway.runtime.saturation`);
- its prefix-cache counters (vLLM's ``vllm:prefix_cache_queries`` and
  ``vllm:prefix_cache_hits``, prompt tokens): the hit rate it reports since laneway
  first read them, beside the one laneway's placement expects
  (``laneway_worker_prefix_hit_ratio_reported`` and ``..._expected``; the dashboard).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from laneway.backends.base import EngineState, Worker
from laneway.runtime.metrics import Metrics
from laneway.runtime.saturation import Saturation
from laneway.runtime.scheduling import SchedulerPort

log = logging.getLogger("laneway.runtime")


@dataclass
class HitCount:
    """An engine's prefix-cache counters: the first reading and the latest."""

    queries0: float
    hits0: float
    queries: float
    hits: float

    def update(self, queries: float, hits: float) -> None:
        if queries < self.queries or hits < self.hits:  # its engine restarted: counting anew
            self.queries0 = self.hits0 = 0.0
        self.queries, self.hits = queries, hits

    @property
    def ratio(self) -> float | None:
        """Hits over queries since the first reading (``None``: nothing asked since)."""
        asked = self.queries - self.queries0
        return (self.hits - self.hits0) / asked if asked > 0 else None


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
    ) -> None:
        self.workers = workers
        # each worker's KV space as the scheduler has it: configured, or as its engine says
        self.kv_tokens: dict[str, int | None] = {name: kv_tokens.get(name) for name in workers}
        self._kv_configured = {name for name, n in self.kv_tokens.items() if n is not None}
        self.saturation = saturation
        self._sched = sched  # (a replica's core may be replaced by its leader's)
        self.metrics = metrics
        self._kick = kick
        self.hits: dict[str, HitCount] = {}
        for name, window in saturation.windows.items():
            metrics.set_concurrency(name, window.limit)

    async def probed(self, name: str) -> None:
        """Worker ``name`` answered its probe: read what its engine says."""
        self.learnt(name)
        state = await self.workers[name].engine_state()
        if state is None:
            return
        self._count_hits(name, state)
        limit = self.saturation.observe(name, state, self.workers[name].capacity().busy)
        if limit is not None:
            self._sched().set_slots(name, limit)
            self.metrics.set_concurrency(name, limit)
            self._kick()

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
        count.update(state.prefix_queries, state.prefix_hits)
        ratio = count.ratio
        if ratio is not None:
            self.metrics.set_reported_hits(name, ratio)

    def reported_hits(self) -> dict[str, float]:
        """Per worker whose engine counts them, the prefix hit rate it reports."""
        return {name: r for name, c in self.hits.items() if (r := c.ratio) is not None}
