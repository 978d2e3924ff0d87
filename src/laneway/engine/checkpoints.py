"""Holding preempted requests' KV caches within a host-memory budget.

Saved caches stay in host memory while the total fits ``budget_bytes``; past
it the oldest are spilled to files under ``spill_dir`` (``torch.save`` of
plain tensors, loaded back with ``weights_only=True``) and read back on resume.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(eq=False)
class SavedKV:
    """One request's saved cache: in memory (``kv``) or in a file (``path``)."""

    key: int
    nbytes: int
    kv: KV | None = None
    path: Path | None = None


def kv_nbytes(kv: KV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


class CheckpointStore:
    def __init__(self, budget_bytes: int, spill_dir: Path) -> None:
        self.budget_bytes = budget_bytes
        self.spill_dir = spill_dir
        self._mem: OrderedDict[int, SavedKV] = OrderedDict()  # oldest first
        self._keys = itertools.count()
        self.in_memory_bytes = 0
        self.spilled_bytes = 0
        self.spills = 0

    def put(self, kv: KV) -> SavedKV:
        saved = SavedKV(next(self._keys), kv_nbytes(kv), kv=kv)
        self._mem[saved.key] = saved
        self.in_memory_bytes += saved.nbytes
        while self.in_memory_bytes > self.budget_bytes and self._mem:
            self._spill(self._mem.popitem(last=False)[1])
        return saved

    def _spill(self, saved: SavedKV) -> None:
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        path = self.spill_dir / f"kv-{saved.key}.pt"
        assert saved.kv is not None
        torch.save([t for pair in saved.kv for t in pair], path)
        saved.kv, saved.path = None, path
        self.in_memory_bytes -= saved.nbytes
        self.spilled_bytes += saved.nbytes
        self.spills += 1

    def take(self, saved: SavedKV) -> KV:
        """The saved cache, released from the store (memory freed, file removed)."""
        if saved.kv is not None:
            kv = saved.kv
            if self._mem.pop(saved.key, None) is not None:
                self.in_memory_bytes -= saved.nbytes
            saved.kv = None
            return kv
        if saved.path is None:
            raise ValueError("checkpoint already resumed or discarded")
        flat = torch.load(saved.path, weights_only=True)
        saved.path.unlink(missing_ok=True)
        saved.path = None
        self.spilled_bytes -= saved.nbytes
        return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]

    def discard(self, saved: SavedKV) -> None:
        if saved.kv is not None or saved.path is not None:
            self.take(saved)

    @property
    def held(self) -> int:
        return len(self._mem)
