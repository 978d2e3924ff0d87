"""The batch of running sequences and their shared, left-padded KV cache.

Rows join and leave between decode steps. A joining row's cache is padded on
the left to the batch's length (or the batch is padded to the row's); the
attention mask hides the padding and each row keeps its own positions, so a
row computes what it would compute alone. Columns that are padding in every
row are trimmed when rows leave.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache

KV = list[tuple[torch.Tensor, torch.Tensor]]


def layer_kv(cache: DynamicCache) -> KV:
    """The keys and values of each layer of ``cache`` (a full-attention model's layers all
    hold both; transformers' types allow layers that do not)."""
    return [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[union-attr, misc]


def _pad_left(t: torch.Tensor, extra: int) -> torch.Tensor:
    if extra == 0:
        return t
    b, h, _, d = t.shape
    return torch.cat([t.new_zeros(b, h, extra, d), t], dim=2)


class KVBatch:
    def __init__(self, config: Any, device: torch.device) -> None:
        self._config = config
        self._device = device
        self.kv: KV = []
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=device)
        self.cache: DynamicCache | None = None

    @property
    def size(self) -> int:
        return int(self.mask.shape[0])

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])

    def _sync_from_cache(self) -> None:
        if self.cache is not None:
            self.kv = layer_kv(self.cache)

    def _rebuild(self) -> None:
        self.cache = DynamicCache(ddp_cache_data=self.kv, config=self._config) if self.size else None

    def add(self, kv: KV, n: int) -> int:
        """Append a row whose cache ``kv`` (batch 1) holds ``n`` tokens; return its row index."""
        self._sync_from_cache()
        kv = [(k[:, :, -n:], v[:, :, -n:]) for k, v in kv]
        if self.size == 0:
            self.kv = [(k.contiguous(), v.contiguous()) for k, v in kv]
            self.mask = torch.ones(1, n, dtype=torch.long, device=self._device)
        else:
            length = max(self.length, n)
            grow, pad = length - self.length, length - n
            self.kv = [
                (
                    torch.cat([_pad_left(bk, grow), _pad_left(k, pad)]),
                    torch.cat([_pad_left(bv, grow), _pad_left(v, pad)]),
                )
                for (bk, bv), (k, v) in zip(self.kv, kv, strict=True)
            ]
            row = torch.zeros(1, length, dtype=torch.long, device=self._device)
            row[0, pad:] = 1
            self.mask = torch.cat([_pad_left_mask(self.mask, grow), row])
        self._rebuild()
        return self.size - 1

    def remove(self, rows: list[int]) -> None:
        """Drop ``rows`` (indices shift down), then trim all-padding columns."""
        if not rows:
            return
        self._sync_from_cache()
        keep = [i for i in range(self.size) if i not in set(rows)]
        if not keep:
            self.kv, self.cache = [], None
            self.mask = torch.zeros(0, 0, dtype=torch.long, device=self._device)
            return
        idx = torch.tensor(keep, device=self._device)
        mask = self.mask.index_select(0, idx)
        live = mask.any(dim=0).nonzero()
        first = int(live[0]) if len(live) else mask.shape[1]
        self.mask = mask[:, first:]
        self.kv = [
            (k.index_select(0, idx)[:, :, first:], v.index_select(0, idx)[:, :, first:]) for k, v in self.kv
        ]
        self._rebuild()

    def row_kv(self, row: int, n: int) -> KV:
        """Row ``row``'s last ``n`` cached tokens, as contiguous host-memory tensors."""
        self._sync_from_cache()
        return [
            (k[row : row + 1, :, -n:].to("cpu").contiguous(), v[row : row + 1, :, -n:].to("cpu").contiguous())
            for k, v in self.kv
        ]

    def extend_mask(self) -> torch.Tensor:
        """Mask for the next decode step: one more real column for every row."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.size, 1)], dim=1)
        return self.mask


def _pad_left_mask(mask: torch.Tensor, extra: int) -> torch.Tensor:
    if extra == 0:
        return mask
    return torch.cat([mask.new_zeros(mask.shape[0], extra), mask], dim=1)
