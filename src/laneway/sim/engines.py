"""Simulated engines with a prefix cache: what a request's prefill really costs where it runs.

A scenario of upstreams (workers of several slots, each an engine such as vLLM) runs its
requests on engines that keep the KV of what they ran, as vLLM's prefix caching does:

- each engine holds the blocks of the prompts it ran and of the replies it made, least
  recently used evicted past its KV space (its worker's ``kv_tokens``); this is the truth
  the scheduler's own index (:class:`~laneway.core.prefix_cache.PrefixIndex`, which sees
  only the prompts it sent) estimates;
- a request's prefill covers only the tokens past the leading blocks its engine holds,
  and an engine prefills one request at a time (prefill is compute-bound: prompts that
  arrive together queue for it), while decoding runs in every slot at once;
- so its time to first token is its wait in laneway's queue, then its wait for the
  engine's prefill, then the prefill of its uncached tokens;
- a request stopped before its first token gives its engine back the prefill it had not
  done (as vLLM drops an aborted request): those queued behind it start theirs sooner.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from laneway.core.prefix_cache import BLOCK_TOKENS, PrefixIndex
from laneway.core.workers import WorkerSpec


class Engines:
    """The engines behind the upstream workers of a simulation, their caches and prefill."""

    def __init__(self, workers: Sequence[WorkerSpec], prefill_tokens_s: float) -> None:
        self.caches = PrefixIndex({w.id: w.kv_tokens for w in workers})
        self.prefill_tokens_s = prefill_tokens_s
        self._prefill_free = dict.fromkeys((w.id for w in workers), 0.0)  # when its prefill is idle
        # per engine, its prefills in order: [request, dispatched at, begins, ends, its
        # prompt's blocks, the tokens of them it held]
        self._prefills: dict[str, list[list[Any]]] = {w.id: [] for w in workers}
        self.prompt_tokens: dict[str, int] = dict.fromkeys(self._prefill_free, 0)
        self.cached_tokens: dict[str, int] = dict.fromkeys(self._prefill_free, 0)

    def start(
        self, worker: str, prefix: Sequence[int], prompt_tokens: int, now: float, rid: str = ""
    ) -> tuple[float, int]:
        """Request ``rid`` starts on ``worker``: the seconds until its first token (the
        engine's prefill queue, then its uncached tokens) and the prompt tokens found in its
        cache."""
        cached = min(self.caches.matched(worker, prefix) * BLOCK_TOKENS, prompt_tokens)
        self.caches.record(worker, prefix)
        begin = max(now, self._prefill_free[worker])
        end = begin + (prompt_tokens - cached) / self.prefill_tokens_s
        self._prefill_free[worker] = end
        queue = self._prefills[worker]
        while queue and queue[0][3] <= now:
            queue.pop(0)  # (done)
        queue.append([rid, now, begin, end, prefix, cached])
        self.prompt_tokens[worker] += prompt_tokens
        self.cached_tokens[worker] += cached
        return end - now, cached

    def give_back(self, worker: str, rid: str, now: float) -> dict[str, float]:
        """Request ``rid`` stopped on ``worker`` at ``now``: the prefill it had not done is
        dropped, and each request queued behind it begins sooner; by how much each of those
        ends its prefill sooner (none if ``rid`` had done its prefill)."""
        queue = self._prefills[worker]
        at = next((i for i, e in enumerate(queue) if e[0] == rid), None)
        if at is None or queue[at][3] <= now:
            return {}
        _, _, begin, _, prefix, cached = queue.pop(at)
        # it holds what was prefilled before the stop, no more (vLLM keeps computed blocks)
        done = cached + max(0.0, now - begin) * self.prefill_tokens_s
        self.caches.drop(worker, prefix[int(done // BLOCK_TOKENS) :])
        sooner: dict[str, float] = {}
        # (those behind it had not begun: it had not ended)
        free = max(now, queue[at - 1][3]) if at > 0 else now
        for entry in queue[at:]:
            other, dispatched, begins, ends = entry[:4]
            shift = begins - max(dispatched, free)
            entry[2], entry[3] = begins - shift, ends - shift
            free = entry[3]
            if shift > 0:
                sooner[other] = shift
        self._prefill_free[worker] = free
        return sooner

    def finished(self, worker: str, prefix: Sequence[int], reply: Sequence[int]) -> None:
        """A request ended on ``worker``: its engine holds the prompt and the reply."""
        if reply:
            self.caches.record(worker, (*prefix, *reply))

    def hit_rate(self) -> float:
        """The share of prompt tokens the engines found in their caches."""
        total = sum(self.prompt_tokens.values())
        return sum(self.cached_tokens.values()) / total if total else 0.0
