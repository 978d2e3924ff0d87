"""Where a new replica of a model would go on a GPU fleet, and what may make room for it.

:class:`GpuRoom` answers from the VRAM book (:class:`~laneway.core.vram.VramBook`) and
changes nothing but the ``draining`` marks it is asked to set:

- :meth:`GpuRoom.choose` — the best GPU group for a new replica: without evictions, or
  counting the idle replicas that may go (:meth:`GpuRoom.evictable`); best fit, then the
  least loaded GPU; in ``naive`` mode the first idle GPU in configuration order;
- :meth:`GpuRoom.victims` — the replicas on one node whose running work, stopped, frees
  the VRAM a model needs (fewest requests stopped first);
- :meth:`GpuRoom.drain_for` — replicas on the best node marked to take no new work, so
  that they go idle and may be evicted for a model that waited past ``switch_wait_s``.
"""

from __future__ import annotations

from collections.abc import Callable

from laneway.core.inventory import GpuSpec, ModelSpec
from laneway.core.replicas import Replica
from laneway.core.request import Request
from laneway.core.vram import EPS, VramBook

Demand = Callable[[str], int]  # a model's queued requests


class GpuRoom:
    def __init__(self, vram: VramBook, switch_wait_s: float) -> None:
        self.vram = vram
        self.switch_wait_s = switch_wait_s
        self.naive = False  # the baseline: one request per idle GPU, whatever is on it goes

    def idle_gpu(self, gid: str) -> bool:
        return not any(r.worker.running or not r.ready for r in self.vram.on_gpu[gid].values())

    def naive_fits(self, g: GpuSpec, model: ModelSpec, cls: int) -> bool:
        return g.admits(cls) and self.idle_gpu(g.id) and g.usable_gb >= model.per_gpu_gb - EPS

    def evictable(
        self,
        r: Replica,
        demand: Demand,
        force: bool,
        now: float,
        keep: ModelSpec | None = None,
        cls: int = 0,
    ) -> bool:
        """Idle, and: drained for someone, or forced, or unwanted — nobody queued for
        it and idle for at least its own load time (evicting sooner risks paying
        the load again for nothing: the ski-rental break-even). Never a replica
        of ``keep``, the model being loaded for class ``cls``, that could serve
        that class itself (evicting it to load another would only churn: a
        replica drained for another model would be evicted and loaded again)."""
        if not r.idle or (r.model is keep and r.worker.spec.admits(cls)):
            return False
        if r.draining:
            return True
        if force and (self.naive or not demand(r.model.name) or not self.fresh(r, now)):
            return True
        return demand(r.model.name) == 0 and now - r.last_used >= r.model.load_s

    def fresh(self, r: Replica, now: float) -> bool:
        """Ready for less than ``switch_wait_s``: a replica loaded for waiting work
        serves it before a switch may take it away (no load ping-pong)."""
        return now - r.ready_at < self.switch_wait_s

    def room(
        self, gpu: GpuSpec, demand: Demand, force: bool, now: float, model: ModelSpec, cls: int
    ) -> tuple[float, float]:
        """(free now, free once evictable idle replicas are gone) on one GPU."""
        free = self.vram.free(gpu)
        extra = sum(
            r.model.per_gpu_gb
            for r in self.vram.on_gpu[gpu.id].values()
            if self.evictable(r, demand, force, now, model, cls)
        )
        return free, free + extra

    def choose(
        self, model: ModelSpec, cls: int, demand: Demand, evict: bool, force: bool, now: float
    ) -> list[GpuSpec] | None:
        """The best GPU group for a new replica of ``model``: without evictions,
        or (``evict``) counting idle replicas that may go (``force``: even those
        with queued demand). ``None`` if no group fits."""
        need = model.per_gpu_gb - EPS
        best: tuple[tuple[float, ...], list[GpuSpec]] | None = None
        for gpus in self.vram.online():
            rows = []
            for g in gpus:
                if not g.admits(cls):
                    continue
                if self.naive:
                    if self.naive_fits(g, model, cls):  # an idle GPU: everything on it may go
                        rows.append(((0.0, 0.0, 0.0, self.vram.order[g.id]), g))
                    continue
                free, most = self.room(g, demand, force, now, model, cls)
                if free >= need:
                    rows.append(
                        ((0.0, free - model.per_gpu_gb, self.vram.running(g), self.vram.order[g.id]), g)
                    )
                elif evict and most >= need:
                    rows.append(
                        ((1.0, most - model.per_gpu_gb, self.vram.running(g), self.vram.order[g.id]), g)
                    )
            if len(rows) < model.gpus:
                continue
            if self.naive:
                rows.sort(key=lambda row: row[0][3])  # configuration order, nothing else
            else:
                rows.sort(key=lambda row: row[0])
            picked = rows[: model.gpus]
            score = tuple(sum(row[0][i] for row in picked) for i in range(4))
            if self.naive:
                score = (min(row[0][3] for row in picked),)
            if best is None or score < best[0]:
                best = (score, [row[1] for row in picked])
        return None if best is None else best[1]

    def victims(
        self, model: ModelSpec, cls: int, stoppable: Callable[[Request], bool]
    ) -> set[Replica] | None:
        """The ready replicas (of other models) on one node whose removal frees the VRAM
        ``model`` needs on enough GPUs admitting ``cls``, taking only replicas whose running
        work is all ``stoppable``: the fewest requests to stop, then the fewest replicas.
        ``None`` when there is no such choice."""
        need = model.per_gpu_gb - EPS
        best: tuple[tuple[int, int], set[Replica]] | None = None
        for gpus in self.vram.online():
            options: list[tuple[int, int, set[Replica]]] = []
            for g in gpus:
                if not g.admits(cls) or g.usable_gb < need:
                    continue
                free = self.vram.free(g)
                chosen: set[Replica] = set()
                others = [r for r in self.vram.on_gpu[g.id].values() if r.ready and r.model is not model]
                for r in sorted(others, key=lambda r: (len(r.worker.running), r.id)):
                    if free >= need:
                        break
                    if all(stoppable(x) for x in r.worker.running.values()):
                        chosen.add(r)
                        free += r.model.per_gpu_gb
                if free >= need:
                    stops = sum(len(r.worker.running) for r in chosen)
                    options.append((stops, self.vram.order[g.id], chosen))
            if len(options) < model.gpus:
                continue
            options.sort(key=lambda o: (o[0], o[1]))
            picked: set[Replica] = set().union(*(o[2] for o in options[: model.gpus]))
            cost = (sum(len(r.worker.running) for r in picked), len(picked))
            if best is None or cost < best[0]:
                best = (cost, picked)
        return None if best is None else best[1]

    def drain_for(self, model: ModelSpec, cls: int, demand: Demand, now: float) -> None:
        """Stop feeding replicas on the best node for ``model`` so that they go idle.

        It drains, per GPU, the replicas with the least queued demand until the
        share would fit, never a model's last ready replica while that model is
        in demand, nor a replica of ``model`` itself.
        """
        for gpus in sorted(self.vram.online(), key=len, reverse=True):
            usable = [g for g in gpus if g.admits(cls) and g.usable_gb >= model.per_gpu_gb]
            if len(usable) < model.gpus:
                continue
            usable.sort(key=lambda g: self.vram.used[g.id])
            for g in usable[: model.gpus]:
                for r in self.vram.on_gpu[g.id].values():
                    if r.draining:  # still needed: it stays drained (lapsed, its queue would refill it)
                        r.draining = max(r.draining, now + self.switch_wait_s)
                free = self.vram.free(g) + sum(
                    r.model.per_gpu_gb for r in self.vram.on_gpu[g.id].values() if r.draining
                )
                for r in sorted(self.vram.on_gpu[g.id].values(), key=lambda r: (demand(r.model.name), r.id)):
                    if free >= model.per_gpu_gb - EPS:
                        break
                    if r.draining or r.model is model or (demand(r.model.name) and self.fresh(r, now)):
                        continue  # a fresh replica with work waiting for it keeps serving a while
                    r.draining = now + self.switch_wait_s  # re-marked while still needed
                    free += r.model.per_gpu_gb
            return
