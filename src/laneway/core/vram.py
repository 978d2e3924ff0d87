"""The VRAM book of a GPU fleet: which replicas hold how much of each GPU.

:class:`VramBook` is the one owner of that account. Placement asks it how much a GPU
has free and which replicas are on it, and tells it when a replica takes or gives back
its share (a load, an adoption; an eviction, a drop); :meth:`VramBook.check` proves the
account adds up and never over-commits a GPU's usable VRAM (its size less the KV-cache
reserve).
"""

from __future__ import annotations

from laneway.core.inventory import GpuSpec, Inventory
from laneway.core.replicas import Replica

EPS = 1e-9  # VRAM compared in GB: below this it is none


class VramBook:
    def __init__(self, inventory: Inventory) -> None:
        self.gpus = {g.id: g for g in inventory.gpus}
        self.nodes = inventory.nodes
        self.order = {g.id: i for i, g in enumerate(inventory.gpus)}  # configuration order
        self.used = {g.id: 0.0 for g in inventory.gpus}  # held by replicas, loading or ready
        self.on_gpu: dict[str, dict[str, Replica]] = {g.id: {} for g in inventory.gpus}
        # nodes nothing is loaded on now (a cluster's node whose owning replica is not known
        # to live: nobody there would start the engine)
        self.offline: set[str] = set()

    def free(self, gpu: GpuSpec) -> float:
        """Usable VRAM of ``gpu`` no replica holds, in GB."""
        return gpu.usable_gb - self.used[gpu.id]

    def fits(self, gpu: GpuSpec, gb: float) -> bool:
        return self.free(gpu) >= gb - EPS

    def running(self, gpu: GpuSpec) -> float:
        """Requests the replicas on ``gpu`` run now."""
        return float(sum(len(r.worker.running) for r in self.on_gpu[gpu.id].values()))

    def online(self) -> list[list[GpuSpec]]:
        """The GPUs of each node that models may be loaded on now."""
        return [gpus for node, gpus in self.nodes.items() if node not in self.offline]

    def hold(self, r: Replica) -> None:
        """Replica ``r`` takes its model's share of each of its GPUs."""
        for gid in r.gpus:
            self.used[gid] += r.model.per_gpu_gb
            self.on_gpu[gid][r.id] = r

    def release(self, r: Replica) -> None:
        """Replica ``r`` gives its share back."""
        for gid in r.gpus:
            left = self.used[gid] - r.model.per_gpu_gb
            self.used[gid] = left if left >= EPS else 0.0
            del self.on_gpu[gid][r.id]

    def check(self) -> None:
        """The account adds up, and no GPU holds more than its usable VRAM."""
        for gid, reps in self.on_gpu.items():
            g = self.gpus[gid]
            held = sum(r.model.per_gpu_gb for r in reps.values())
            assert abs(held - self.used[gid]) < 1e-6, f"{gid}: VRAM books disagree"
            assert held <= g.usable_gb + 1e-6, f"{gid}: {held} GB > {g.usable_gb} GB usable"
