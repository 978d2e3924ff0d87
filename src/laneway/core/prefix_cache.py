"""Where the prefix cache is: per worker, the prompt blocks it likely holds.

An engine with prefix caching (vLLM, SGLang) keeps the KV of the prompts it ran until
it needs the space; a request whose prompt starts with blocks it still holds skips their
prefill. laneway cannot see the engine's cache, so it keeps a model of it: each prompt
sent to a worker (its chain of block hashes, :mod:`laneway.runtime.prefix`) is recorded
there, most recent last (its head last), and the least recently used blocks are evicted
past the worker's capacity (its KV space in tokens, over the tokens of a block). A
request then matches, on each worker, the leading blocks of its chain recorded there.

It is an estimate (an engine also holds the output it made, shares its space with
running requests, evicts by its own rule), kept cheap: a match is a binary search of
dictionary lookups.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

# tokens a block of the prefix chain stands for (128 characters of ~4 characters a token)
BLOCK_TOKENS = 32
# an engine's KV space when it does not say (tokens): a GPU's worth, modestly
DEFAULT_KV_TOKENS = 65_536


class PrefixIndex:
    """The blocks each worker likely holds, least recently used first."""

    def __init__(self, kv_tokens: Mapping[str, int | None], block_tokens: int = BLOCK_TOKENS) -> None:
        self.block_tokens = block_tokens
        self._blocks: dict[str, OrderedDict[int, None]] = {w: OrderedDict() for w in kv_tokens}
        self._cap: dict[str, int] = {}
        for w, tokens in kv_tokens.items():
            self.set_capacity(w, tokens)
        # what placement expected: blocks matched and blocks sent, a worker (its hit rate)
        self.matched_blocks: dict[str, int] = dict.fromkeys(kv_tokens, 0)
        self.sent_blocks: dict[str, int] = dict.fromkeys(kv_tokens, 0)

    def __contains__(self, worker: object) -> bool:
        return worker in self._blocks

    def capacity(self, worker: str) -> int:
        """Blocks ``worker`` holds at most."""
        return self._cap[worker]

    def set_capacity(self, worker: str, kv_tokens: int | None) -> None:
        """``worker``'s KV space in tokens (``None``: not known, the default)."""
        tokens = DEFAULT_KV_TOKENS if kv_tokens is None else kv_tokens
        self._cap[worker] = max(tokens // self.block_tokens, 1)
        self._blocks.setdefault(worker, OrderedDict())
        self._evict(worker)

    def matched(self, worker: str, blocks: Sequence[int]) -> int:
        """How many leading ``blocks`` ``worker`` likely holds.

        What a worker holds of a chain is always a leading part of it (a chain is
        recorded whole, its head most recently used, so its tail is evicted first; and
        a block's hash names every block before it): a binary search finds its end."""
        held = self._blocks[worker]
        lo, hi = 0, len(blocks)  # the first lo blocks are held; none past the first hi
        if hi and blocks[-1] in held:
            return hi
        hi -= 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if blocks[mid - 1] in held:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def record(self, worker: str, blocks: Sequence[int], matched: int | None = None) -> None:
        """``blocks`` were sent to ``worker``: it holds them now, most recently used, the
        head of the chain last (an engine evicts a cached prompt from its tail, as vLLM
        frees a request's blocks tail first). A chain longer than the worker holds at all
        is not recorded: no engine holds it whole (it is refused, or cannot run), and
        recording it would push every other prompt out. ``matched``: :meth:`matched` of
        ``blocks`` there, where the caller has it already."""
        if not blocks or len(blocks) > self._cap[worker]:
            return
        held = self._blocks[worker]
        if matched is None:
            matched = self.matched(worker, blocks)
        self.matched_blocks[worker] = self.matched_blocks.get(worker, 0) + matched
        self.sent_blocks[worker] = self.sent_blocks.get(worker, 0) + len(blocks)
        for b in reversed(blocks):
            if b in held:
                held.move_to_end(b)
            else:
                held[b] = None
        self._evict(worker)

    def drop(self, worker: str, blocks: Sequence[int]) -> None:
        """``worker`` does not hold ``blocks`` after all (its engine refused the prompt
        before prefilling it)."""
        held = self._blocks[worker]
        for b in blocks:
            held.pop(b, None)

    def forget(self, worker: str) -> None:
        """``worker``'s cache is gone (its engine restarted, or was replaced)."""
        self._blocks[worker].clear()

    def held(self, worker: str) -> int:
        return len(self._blocks[worker])

    def _evict(self, worker: str) -> None:
        held, cap = self._blocks[worker], self._cap[worker]
        while len(held) > cap:
            held.popitem(last=False)
