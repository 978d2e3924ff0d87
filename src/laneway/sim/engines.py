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
  engine's prefill, then the prefill of its uncached tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from laneway.core.prefix_cache import BLOCK_TOKENS, PrefixIndex
from laneway.core.workers import WorkerSpec


class Engines:
    """The engines behind the upstream workers of a simulation, their caches and prefill."""

    def __init__(self, workers: Sequence[WorkerSpec], prefill_tokens_s: float) -> None:
        self.caches = PrefixIndex({w.id: w.kv_tokens for w in workers})
        self.prefill_tokens_s = prefill_tokens_s
        self._prefill_free = dict.fromkeys((w.id for w in workers), 0.0)  # when its prefill is idle
        self.prompt_tokens: dict[str, int] = dict.fromkeys(self._prefill_free, 0)
        self.cached_tokens: dict[str, int] = dict.fromkeys(self._prefill_free, 0)

    def start(self, worker: str, prefix: Sequence[int], prompt_tokens: int, now: float) -> tuple[float, int]:
        """A request starts on ``worker``: the seconds until its first token (the engine's
        prefill queue, then its uncached tokens) and the prompt tokens found in its cache."""
        cached = min(self.caches.matched(worker, prefix) * BLOCK_TOKENS, prompt_tokens)
        self.caches.record(worker, prefix)
        begin = max(now, self._prefill_free[worker])
        end = begin + (prompt_tokens - cached) / self.prefill_tokens_s
        self._prefill_free[worker] = end
        self.prompt_tokens[worker] += prompt_tokens
        self.cached_tokens[worker] += cached
        return end - now, cached

    def finished(self, worker: str, prefix: Sequence[int], reply: Sequence[int]) -> None:
        """A request ended on ``worker``: its engine holds the prompt and the reply."""
        if reply:
            self.caches.record(worker, (*prefix, *reply))

    def hit_rate(self) -> float:
        """The share of prompt tokens the engines found in their caches."""
        total = sum(self.prompt_tokens.values())
        return sum(self.cached_tokens.values()) / total if total else 0.0
