"""GPU-aware placement: replicas of models on GPUs, chosen by filter then score.

A *replica* is one loaded copy of a model on one GPU, or on ``gpus`` GPUs of
one node for a tensor-parallel model. To the scheduler a ready replica is a
worker with ``ModelSpec.slots`` slots serving that one model.

Answers, as the Kubernetes scheduler framework does (:mod:`laneway.core.placement`):

- :meth:`GpuPlacement.take_slot` — a slot of a ready replica (*now*), or
  ``None`` (*not now*: waiting, a load or a preemption may help); chosen among the
  model's replicas by :func:`~laneway.core.placement.choose` with :data:`REPLICA_FILTERS`
  and :data:`REPLICA_SCORERS`;
- :meth:`GpuPlacement.never` — why no GPU group could *ever* hold the model
  (reject at once, naming the model and its VRAM need);
- :meth:`GpuPlacement.plan` — the loads (and the evictions of idle replicas
  they need) that would serve a waiting request, as decisions.

Filters: the weights fit in the VRAM left after the KV-cache reserve (never
over-committed), the GPU is not reserved for other classes, a multi-GPU model
gets GPUs of one node. Scores: a resident replica first (no cold start), then
a load that evicts nothing, then best fit (the least VRAM left over, keeping
big GPUs for big models), then the least loaded GPU.

Same-model grouping: a request whose model is not resident waits while other
models' requests keep their replicas busy; only idle replicas that nobody is
queued for are evicted. After ``switch_wait_s`` it stops waiting politely:
replicas in its way are *drained* (no new work) so they become idle and can be
evicted — overtaking is bounded, nobody starves.

Where a new replica fits, and what may make room: :mod:`laneway.core.gpu_room`. LoRA
adapters run inside replicas of their base (:mod:`laneway.core.adapters`).

The ``naive`` mode is the baseline: one request per GPU, on the first idle GPU
(group) in configuration order that can hold the model, resident there or not
(no affinity), evicting whatever is in the way (no grouping).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from laneway.core.adapters import Adapters
from laneway.core.decisions import Decision, Evict, Load
from laneway.core.errors import ConfigError
from laneway.core.gpu_room import GpuRoom
from laneway.core.inventory import GpuSpec, Inventory, ModelSpec
from laneway.core.placement import AdmitsClass, Filter, Scorer, choose
from laneway.core.replicas import HasFreeSlot, InService, MostFreeSlots, NotDraining, Replica, classes_of
from laneway.core.request import Request
from laneway.core.vram import EPS as _EPS
from laneway.core.vram import VramBook
from laneway.core.workers import WorkerState


class GpuPlacement:
    takes_any = False  # (a slot of a replica is taken only by placement)

    def __init__(self, inventory: Inventory, *, naive: bool = False, switch_wait_s: float = 60.0) -> None:
        self.inv = inventory
        self.vram = VramBook(inventory)  # which replicas hold how much of each GPU
        self.room = GpuRoom(self.vram, switch_wait_s)  # where a new replica would go
        self.replicas: dict[str, Replica] = {}
        self.by_model: dict[str, list[Replica]] = {}
        self.loads = 0
        self.evictions = 0
        self._seq = 0
        self.down: set[str] = set()  # replicas out of placement until they recover
        # replicas of models with a sleep mode, evicted to sleep: they hold no VRAM and wake
        # in ``wake_s`` where they were (at most ``max_asleep``; the oldest beyond is stopped)
        self.asleep: dict[str, Replica] = {}
        self.wakes = 0
        # which ready replica of its model a request takes: filters, then scores
        self.filters: tuple[Filter, ...] = (
            HasFreeSlot(),
            AdmitsClass(),
            InService(self.down),
            NotDraining(self.replicas),
        )
        self.scorers: tuple[Scorer, ...] = (MostFreeSlots(),)
        self.adapters = Adapters(inventory, self.replicas, self.filters)  # LoRA adapters in replicas
        # preloads are placed best-fit next to each other, in naive mode too (its
        # "first idle GPU, evict what is there" would evict the preloads before)
        self.naive = False
        for name in inventory.preload:  # ready at start-up; not counted as loads
            model = inventory.models[name]
            group = self.room.choose(model, 0, lambda _m: 0, False, False, 0.0)
            if group is None:
                before = inventory.preload[: inventory.preload.index(name)]
                where = f"next to {', '.join(before)} (preloaded before it)" if before else "on this fleet"
                raise ConfigError(f"preload: model {name!r} does not fit {where}")
            self._load(model, group, 0.0, lambda _m: 0, force=False, cls=0)
            self.loaded(next(reversed(self.replicas)), 0.0)
            self.loads -= 1
        self.naive = naive

    @property
    def naive(self) -> bool:
        return self.room.naive

    @naive.setter
    def naive(self, naive: bool) -> None:
        self.room.naive = naive

    @property
    def switch_wait_s(self) -> float:
        return self.room.switch_wait_s

    # ------------------------------------------------------------------ Placement protocol
    def take_slot(self, req: Request, now: float) -> WorkerState | None:
        w = self._place(req, now)
        if w is not None:
            w.free -= 1
            adapter = self.adapters.spec(req.model)
            if adapter is not None:
                self.adapters.hold(self.replicas[w.id], adapter, now)
        return w

    def helps(self, model: str | None) -> Callable[[Request, str], bool] | None:
        """For a waiting request of ``model``: whether stopping a running request on a worker
        would let it start there (:meth:`Adapters.helps`)."""
        return self.adapters.helps(model)

    def adapter_gone(self, replica_id: str, adapter: str) -> None:
        """``adapter`` is not in replica ``replica_id``'s engine after all (its load failed)."""
        self.adapters.gone(replica_id, adapter)

    def take(self, worker: WorkerState) -> None:
        raise ConfigError("a replica's slots are taken by placement only")

    def holder_of(self, req: Request) -> str | None:
        return None  # (no prefix cache is modelled for a fleet's replicas)

    def _place(self, req: Request, now: float) -> WorkerState | None:
        if self.naive:
            return self._place_naive(req)
        adapter = self.adapters.spec(req.model)
        if adapter is not None:
            bases = self.by_model.get(adapter.adapter_of or "", ())
            return self.adapters.place(req, adapter, bases, now)
        ready = (r.worker for r in self.by_model.get(req.model, ()) if r.ready)  # type: ignore[arg-type]
        return choose(req, ready, self.filters, self.scorers, now)

    def _spec(self, model: str | None) -> ModelSpec | None:
        """The spec of the model whose replicas serve ``model`` (an adapter's base)."""
        spec = self.inv.models.get(model)  # type: ignore[arg-type]
        if spec is not None and spec.adapter_of is not None:
            return self.inv.models[spec.adapter_of]
        return spec

    def _place_naive(self, req: Request) -> WorkerState | None:
        """One request per GPU: the first idle GPU (configuration order) that fits.
        If the model happens to be resident there it runs at once; else it is
        loaded there (``plan``), whatever other GPU holds it already."""
        model = self._spec(req.model)
        if model is None:
            return None
        for g in self.inv.gpus:
            if not self.room.naive_fits(g, model, req.cls):
                continue
            for r in self.vram.on_gpu[g.id].values():
                # (a multi-GPU replica may span a GPU reserved for other classes)
                if (
                    r.model is model
                    and r.worker.spec.admits(req.cls)
                    and r.worker.id not in self.down
                    and all(map(self.room.idle_gpu, r.gpus))
                ):
                    return r.worker
            if model.gpus == 1 and g.node not in self.vram.offline:
                return None  # load it here (nothing is loaded on a node offline)
        return None

    def never(self, req: Request) -> str | None:
        return self.inv.never(req.model, req.priority)

    def free_slot(self, worker: WorkerState) -> None:
        worker.free += 1

    def set_available(self, worker: WorkerState, available: bool) -> None:
        if available:
            self.down.discard(worker.id)
        else:
            self.down.add(worker.id)

    # ------------------------------------------------------------------ loads
    def touch(self, worker_id: str, now: float) -> None:
        r = self.replicas.get(worker_id)
        if r is not None:
            r.last_used = now

    def loading_slots(self, model: str) -> int:
        return sum(r.model.slots for r in self.by_model.get(model, ()) if not r.ready)

    def plan(self, req: Request, now: float, demand: Callable[[str], int], waited_s: float) -> list[Decision]:
        """Loads (after evictions) that would serve ``req``; [] if none is possible
        or useful now. ``demand(model)`` counts the queued requests of a model."""
        model = self._spec(req.model)
        if model is None:
            return []
        demand = self.adapters.demand(demand)
        if self.loading_slots(model.name) >= demand(model.name):
            return []  # what is already loading will serve the queue
        # it waited long enough to displace others — unless its model has a replica for
        # it already: then its queue is served (it waits its turn there), and another
        # replica comes only into room nobody else needs (forcing one churned: a second
        # 70B replica evicted the 13B replicas in demand, which were loaded back, ...)
        serving = not self.naive and self._serving(model.name, req.cls)
        switch = waited_s >= self.switch_wait_s and not serving
        force = self.naive or switch
        # free VRAM first; then evicting idle replicas nobody is queued for (LRU);
        # then, once it has waited long enough, idle replicas others are queued for.
        # Another replica of a model that has one goes only into free VRAM: evicting
        # an idle model to make a second copy of a busy one would load the idle one
        # back as soon as work for it comes (and its work would wait for that load)
        if self.asleep and not self.naive:  # a replica asleep where there is room: woken in seconds
            woken = self._wake(model, req.cls, demand, now, force and not serving)
            if woken is not None:
                return woken
        group = self.room.choose(model, req.cls, demand, False, False, now) or (
            None
            if serving
            else (
                self.room.choose(model, req.cls, demand, True, False, now)
                or (self.room.choose(model, req.cls, demand, True, True, now) if force else None)
            )
        )
        if group is None:
            if switch and not self.naive:
                self.room.drain_for(model, req.cls, demand, now)
            return []
        return self._load(model, group, now, demand, force=force, cls=req.cls)

    def _wake(
        self, model: ModelSpec, cls: int, demand: Callable[[str], int], now: float, force: bool
    ) -> list[Decision] | None:
        """Wake an asleep replica of ``model`` (the most recently used first) whose GPUs admit
        ``cls`` and have its share free, or will once unwanted idle replicas go."""
        mine = [r for r in self.asleep.values() if r.model.name == model.name]
        need = model.per_gpu_gb - _EPS
        for r in sorted(mine, key=lambda r: (-r.last_used, r.id)):
            group = [self.vram.gpus[gid] for gid in r.gpus]
            if group[0].node in self.vram.offline:
                continue
            if all(
                g.admits(cls) and self.room.room(g, demand, force, now, model, cls)[1] >= need for g in group
            ):
                return self._load(model, group, now, demand, force=force, cls=cls, woken=r)
        return None

    def reload(self, model: str, now: float) -> list[Decision]:
        """A replica of preloaded ``model`` again (its start failed, or its engine died),
        into free VRAM only (best fit, nothing evicted, no GPU reserved for other classes);
        [] if one is loading or ready, or none fits now."""
        spec = self.inv.models[model]
        if self.by_model.get(model) or self.naive:
            return []
        group = self.room.choose(spec, 0, lambda _m: 0, False, False, now)
        if group is None:
            return []
        return self._load(spec, group, now, lambda _m: 0, force=False, cls=0)

    def asleep_of(self, model: str) -> bool:
        """Whether a replica of ``model`` sleeps (it would be woken, not loaded cold)."""
        return any(r.model.name == model for r in self.asleep.values())

    def _serving(self, model: str, cls: int) -> bool:
        """Whether a replica of ``model`` that takes class ``cls`` is ready or loading."""
        return any(
            r.worker.spec.admits(cls) and r.worker.id not in self.down for r in self.by_model.get(model, ())
        )

    def _load(
        self,
        model: ModelSpec,
        group: list[GpuSpec],
        now: float,
        demand: Callable[[str], int],
        force: bool,
        cls: int,
        woken: Replica | None = None,
    ) -> list[Decision]:
        out: list[Decision] = []
        if woken is not None:  # (awake from here on: never the one trimmed below)
            del self.asleep[woken.id]
        for g in group:
            # evict least recently used idle replicas until the share fits
            idle = sorted(  # nobody queued for it first, then least recently used
                (
                    r
                    for r in self.vram.on_gpu[g.id].values()
                    # (naive: the whole idle GPU may go, a replica of the model too)
                    if self.room.evictable(
                        r, demand, force or self.naive, now, None if self.naive else model, cls
                    )
                ),
                key=lambda r: (demand(r.model.name) > 0, r.last_used, r.id),
            )
            while not self.vram.fits(g, model.per_gpu_gb) and idle:
                out.append(self.evict(idle.pop(0)))
                self._trim_asleep(out)  # (each sleeper past max_asleep stopped at once)
            assert self.vram.fits(g, model.per_gpu_gb), "plan over-commits VRAM"

        if woken is not None:  # back where it slept, under its model's current spec
            r = woken
            r.model = model
            r.ready = False
            r.draining = 0.0
            rid, load_s = r.id, model.wake_s or 0.0
            self.wakes += 1
        else:
            self._seq += 1
            rid = f"{model.name}#{self._seq}@{'+'.join(g.id for g in group)}"
            r = Replica(
                rid,
                model,
                tuple(g.id for g in group),
                classes_of(group),
                self.adapters.of_base(model.name),
            )
            load_s = model.load_s
            self.loads += 1
        r.last_used = now
        r.ready_at = now + load_s
        self.replicas[rid] = r
        self.by_model.setdefault(model.name, []).append(r)
        self.vram.hold(r)
        out.append(Load(rid, model.name, r.gpus, load_s, wake=woken is not None))
        return out

    def _trim_asleep(self, out: list[Decision]) -> None:
        """Past ``max_asleep`` asleep replicas, the least recently used are stopped."""
        while len(self.asleep) > self.inv.max_asleep:
            oldest = min(self.asleep.values(), key=lambda r: (r.last_used, r.id))
            del self.asleep[oldest.id]
            out.append(Evict(oldest.id, oldest.model.name, oldest.gpus))

    def evict(self, r: Replica) -> Evict:
        assert not r.worker.running, "only idle replicas are evicted"
        self._unplace(r)
        self.evictions += 1
        sleep = r.model.wake_s is not None and self.inv.max_asleep > 0 and not self.naive
        if sleep:  # (its engine keeps it in host memory; it wakes where it was)
            r.ready = False
            r.draining = 0.0
            self.asleep[r.id] = r
        return Evict(r.id, r.model.name, r.gpus, sleep=sleep)

    def _unplace(self, r: Replica) -> None:
        """Replica ``r`` holds no VRAM and no adapter from now on."""
        self.adapters.forget(r.id)  # (asleep or stopped, its engine holds no adapter for us)
        del self.replicas[r.id]
        self.by_model[r.model.name].remove(r)
        self.vram.release(r)

    def drop(self, replica_id: str) -> None:
        """Replica ``replica_id`` is gone without an eviction (its load failed, its engine
        died): its VRAM is free from now on. It runs nothing (the runtime ended or requeued
        its requests first)."""
        if self.asleep.pop(replica_id, None) is not None:  # (its engine died asleep)
            return
        r = self.replicas[replica_id]
        if r.worker.running:
            raise ConfigError(f"replica {replica_id} still runs {len(r.worker.running)} requests")
        self._unplace(r)
        self.down.discard(r.id)

    def load_took(self, model: str, seconds: float, *, wake: bool = False) -> None:
        """A load (``wake``: a wake) of ``model`` took ``seconds``: later decisions count that,
        not the configured ``load_s`` (``wake_s``); the spec is replaced everywhere it is held."""
        old = self.inv.models[model]
        new = replace(old, wake_s=max(seconds, 0.0)) if wake else replace(old, load_s=max(seconds, 0.0))
        models = self.inv.models
        assert isinstance(models, dict)
        models[model] = new
        for r in self.by_model.get(model, ()):
            r.model = new
        for r in self.asleep.values():
            if r.model.name == model:
                r.model = new

    def adopt(self, replica_id: str, model: str, gpus: tuple[str, ...], now: float) -> None:
        """A replica whose engine runs already, placed by an earlier scheduler (a cluster's
        leader before this one): held where it is, as loading until :meth:`loaded`. A
        :class:`ConfigError` names why it cannot be (an unknown model or GPU, GPUs of two
        nodes or of the wrong count, VRAM taken)."""
        spec = self.inv.models.get(model)
        if spec is None or spec.adapter_of is not None:
            raise ConfigError(f"replica {replica_id}: no model {model!r} to load in the fleet")
        if replica_id in self.replicas or replica_id in self.asleep:
            raise ConfigError(f"replica {replica_id}: placed already")
        group = [self.vram.gpus.get(gid) for gid in gpus]
        if any(g is None for g in group) or len(gpus) != spec.gpus or len({g.node for g in group if g}) != 1:
            raise ConfigError(f"replica {replica_id}: GPUs {', '.join(gpus)} cannot hold {model!r}")
        for gid in gpus:
            if not self.vram.fits(self.vram.gpus[gid], spec.per_gpu_gb):
                raise ConfigError(f"replica {replica_id}: no room for {model!r} left on {gid}")
        seq = replica_id.rpartition("#")[2].partition("@")[0]
        if seq.isdigit():  # (the ids this placement makes from now on are new ones)
            self._seq = max(self._seq, int(seq))
        r = Replica(
            replica_id,
            spec,
            tuple(gpus),
            classes_of([self.vram.gpus[g] for g in gpus]),
            self.adapters.of_base(model),
        )
        r.last_used = r.ready_at = now
        self.replicas[replica_id] = r
        self.by_model.setdefault(model, []).append(r)
        self.vram.hold(r)

    def loaded(self, replica_id: str, now: float) -> WorkerState:
        r = self.replicas[replica_id]
        r.ready = True
        r.ready_at = now
        r.last_used = now
        return r.worker

    def make_room(
        self, req: Request, now: float, stoppable: Callable[[Request], bool]
    ) -> list[Request] | None:
        """Room for ``req`` whose model fits nowhere now, by preemption.

        It picks, on one node, the replicas whose removal frees the VRAM the model
        needs on enough GPUs, taking only replicas whose running work is all
        ``stoppable`` by the request's class, cheapest first (fewest running
        requests to stop). They are drained (no new work) and their running
        requests returned for preemption; once idle they are evicted for the
        load. ``None`` when there is no such choice, or a replica of the model
        is already loading.
        """
        model = self._spec(req.model)
        if model is None or any(not r.ready for r in self.by_model.get(model.name, ())):
            return None
        picked = self.room.victims(model, req.cls, stoppable)
        if picked is None:
            return None
        victims: list[Request] = []
        for r in sorted(picked, key=lambda r: r.id):
            r.draining = now + self.switch_wait_s
            victims.extend(r.worker.running.values())
        return victims

    # ------------------------------------------------------------------ gauges and checks
    def gauges(self) -> dict[str, Any]:
        """Per-GPU gauges for :class:`~laneway.core.stats.Snapshot`."""
        return {
            "vram_used_gb": dict(self.vram.used),
            "vram_total_gb": {g.id: g.vram_gb for g in self.inv.gpus},
            "loaded_models": {
                gid: sorted(r.model.name for r in reps.values()) for gid, reps in self.vram.on_gpu.items()
            },
            "model_evictions": self.evictions,
            "asleep_models": {
                gid: sorted(r.model.name for r in self.asleep.values() if gid in r.gpus)
                for gid in self.vram.used
            },
        }

    def check(self) -> None:
        """VRAM never over-committed, the KV reserve held, multi-GPU replicas on one node, no
        more adapters in a replica than its ``max_adapters``."""
        self.vram.check()
        for r in self.replicas.values():
            assert len({self.vram.gpus[gid].node for gid in r.gpus}) == 1, f"{r.id} spans nodes"
            assert len(r.gpus) == r.model.gpus
        self.adapters.check()
