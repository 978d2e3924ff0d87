"""A GPU-aware test driver: the core ``Driver`` plus model loads and evictions.

It keeps its own books of the replicas (loading or ready, on which GPUs) and
checks every decision against them, independently of ``check_invariants``:

- a ``Load`` names a new replica of a known model, on ``gpus`` distinct GPUs of
  one node that all fit the model's share next to what they already hold (the
  KV reserve kept), with the model's ``load_s``, for queued requests of the
  model that the replicas already loading will not take; the driver answers
  ``loaded`` once the clock passes ``load_s`` (or when told to);
- an ``Evict`` names a ready replica with nothing running (or stopping) on it;
- a ``Dispatch`` goes to a ready replica of the request's model (an adapter's: of its
  base, holding the adapter) whose GPUs all admit the request's class;
- a ``LoadAdapter`` names a ready replica of the adapter's base that does not hold it and
  has room for it (fewer than ``max_adapters``, after the unloads before it); an
  ``UnloadAdapter`` an adapter the replica holds and runs nothing of.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from laneway.core import Decision, Dispatch, Request, Scheduler, SchedulerConfig
from laneway.core.decisions import Evict, Load, LoadAdapter, UnloadAdapter
from laneway.core.gpu_placement import GpuPlacement
from laneway.core.inventory import GpuSpec, Inventory, ModelSpec

from .helpers import Driver

EPS = 1e-6
CHURN_BOUND = 2_000  # rounds of the scheduler at one instant (loads that take no time): more is a churn


def gpu(
    gid: str, vram_gb: float, node: str = "n", kv: float = 0.0, reserved: set[int] | None = None
) -> GpuSpec:
    return GpuSpec(gid, node, vram_gb, kv, None if reserved is None else frozenset(reserved))


def model(name: str, vram_gb: float, gpus: int = 1, load_s: float = 10.0, slots: int = 4) -> ModelSpec:
    return ModelSpec(name, vram_gb, gpus, load_s, slots)


def inventory(gpus: list[GpuSpec], models: list[ModelSpec], preload: tuple[str, ...] = ()) -> Inventory:
    return Inventory(tuple(gpus), {m.name: m for m in models}, preload)


def gpu_sched(
    inv: Inventory,
    policy: str = "laneway",
    *,
    switch_wait_s: float | None = None,
    **cfg: Any,
) -> Scheduler:
    """A scheduler on a GPU fleet (``naive`` placement under the naive policy)."""
    extra = {} if switch_wait_s is None else {"switch_wait_s": switch_wait_s}
    placement = GpuPlacement(inv, naive=policy == "naive", **extra)
    config = SchedulerConfig(**cfg) if cfg else None
    return Scheduler([], config, policy, placement=placement)


def greq(rid: str, priority: int, arrival_s: float, model_name: str | None, **kw: Any) -> Request:
    return Request(rid, priority, arrival_s, model=model_name, **kw)


@dataclass
class GpuDriver(Driver):
    """``Driver`` for a scheduler with a :class:`GpuPlacement`."""

    auto_load: bool = True  # answer ``loaded`` once the clock passes a load's end
    loading: dict[str, float] = field(default_factory=dict)  # replica -> when its load ends
    ready: set[str] = field(default_factory=set)
    replica_model: dict[str, str] = field(default_factory=dict)
    replica_gpus: dict[str, tuple[str, ...]] = field(default_factory=dict)
    model_of: dict[str, str | None] = field(default_factory=dict)  # request -> model
    class_of: dict[str, int] = field(default_factory=dict)  # request -> priority
    loads: list[tuple[float, Load]] = field(default_factory=list)
    evictions: list[tuple[float, Evict]] = field(default_factory=list)
    dispatches: list[tuple[float, Dispatch]] = field(default_factory=list)
    loaded_at: dict[str, float] = field(default_factory=dict)  # replica -> when ``loaded`` was said
    asleep: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)  # replica -> model, GPUs
    wakes: list[tuple[float, Load]] = field(default_factory=list)
    adapters: dict[str, set[str]] = field(default_factory=dict)  # replica -> the adapters it holds
    adapter_loads: list[tuple[float, LoadAdapter]] = field(default_factory=list)
    adapter_unloads: list[tuple[float, UnloadAdapter]] = field(default_factory=list)
    _queued_before: dict[str, int] = field(default_factory=dict)  # model -> queued when a step began

    def __post_init__(self) -> None:
        for rid, r in self.placement.replicas.items():  # preloaded at start-up
            assert r.ready, f"{rid}: preloaded replicas are ready at start"
            self.ready.add(rid)
            self.replica_model[rid] = r.model.name
            self.replica_gpus[rid] = r.gpus
            self.loaded_at[rid] = 0.0
        self._check_vram()

    @property
    def placement(self) -> GpuPlacement:
        p = self.sched.planner
        assert p is not None, "the scheduler has no GPU placement"
        return p

    @property
    def inv(self) -> Inventory:
        return self.placement.inv

    # -- events -------------------------------------------------------------
    def submit(self, r: Request) -> Any:
        self.model_of[r.id] = r.model
        self.class_of[r.id] = r.priority
        return super().submit(r)

    def load_done(self, replica_id: str) -> list[Decision]:
        """The runtime answers ``loaded`` now (maybe before ``load_s``), then schedules."""
        self._loaded(replica_id)
        return self.step()

    def step(self) -> list[Decision]:
        lanes = self.sched.lanes
        inv = self.inv
        self._queued_before = {m: lanes.model_queued(m) for m in inv.models}
        for base, adapters in inv.adapters.items():  # (an adapter's requests are its base's demand)
            self._queued_before[base] += sum(lanes.model_queued(a) for a in adapters)
        out = super().step()
        # (within a step a sleeper past the bound is stopped, a woken one leaves the sleepers)
        assert len(self.asleep) <= self.inv.max_asleep, f"asleep past max_asleep: {self.asleep}"
        assert set(self.asleep) == set(self.placement.asleep), (self.asleep, self.placement.asleep)
        return out

    def apply(self, d: Decision) -> None:
        if type(d) is Load:
            self._apply_load(d)
        elif type(d) is Evict:
            self._apply_evict(d)
        elif type(d) is LoadAdapter:
            self._apply_load_adapter(d)
        elif type(d) is UnloadAdapter:
            self._apply_unload_adapter(d)
        else:
            super().apply(d)
            if type(d) is Dispatch:
                self._check_dispatch(d)

    def advance(self, dt: float) -> list[Decision]:
        """Move the clock by ``dt``: at every scheduler wakeup and every load end on
        the way, answer the loads due and call ``schedule``."""
        target = self.now + dt
        out: list[Decision] = []
        spins = same = 0
        while (t := self._next_event()) <= target:
            # an event due now again is fine while each brings something about (models that
            # load in no time: a load, then a dispatch, then the next load...); five that
            # change nothing would be the scheduler spinning
            before = (len(out), len(self.loading), len(self.running), self.sched.lanes.total)
            again = t <= self.now  # (no time passes)
            self.now = max(self.now, t)
            self._answer_due()
            out += self.step()
            moved = (len(out), len(self.loading), len(self.running), self.sched.lanes.total) != before
            spins = spins + 1 if again and not moved else 0
            assert spins < 5, f"the next event stays at {t} <= now {self.now}, and nothing happens"
            # (each load at one instant places a model anew: there are only so many to make)
            same = same + 1 if again else 0
            assert same < CHURN_BOUND, f"{same} rounds at t = {self.now}: {out[-6:]}"
        self.now = target
        self._answer_due()
        out += self.step()
        return out

    def drain(self, limit: int = 20_000) -> None:
        """Let everything run to the end, loads included: acknowledge stops, answer
        loads as they end, finish runs, follow wakeups (at least one second a round)."""
        for _ in range(limit):
            if not self.sched.live and not self.loading:
                return
            for rid in sorted(self.stopping):
                self.ack(rid)
            self._answer_due()
            self.step()
            for rid in sorted(self.running):
                if rid not in self.stopping:
                    self.finish(rid)
            self.now += 1.0
            t = self._next_event()
            if math.isfinite(t):
                self.now = max(self.now, t)
            self._answer_due()
            self.step()
        raise AssertionError(f"the system did not drain: {self.sched.live} requests still live")

    # -- what the driver saw ------------------------------------------------
    def started(self, rid: str) -> float | None:
        """When ``rid`` was first dispatched (None: never)."""
        for t, d in self.dispatches:
            if d.request_id == rid:
                return t
        return None

    def worker_of(self, rid: str) -> str:
        for _, d in reversed(self.dispatches):
            if d.request_id == rid:
                return d.worker_id
        raise AssertionError(f"{rid} was never dispatched")

    def gpus_of(self, rid: str) -> tuple[str, ...]:
        return self.replica_gpus[self.worker_of(rid)]

    def resident(self) -> dict[str, list[str]]:
        """Model -> its replicas (loading or ready), by the driver's books."""
        out: dict[str, list[str]] = {}
        for rid, m in self.replica_model.items():
            out.setdefault(m, []).append(rid)
        return out

    def held(self) -> Mapping[str, float]:
        """VRAM held per GPU by the driver's books."""
        used = {g.id: 0.0 for g in self.inv.gpus}
        for rid, m in self.replica_model.items():
            spec = self.inv.models[m]
            for gid in self.replica_gpus[rid]:
                used[gid] += spec.per_gpu_gb
        return used

    # -- internals ----------------------------------------------------------
    def _next_event(self) -> float:
        t = self.sched.next_wakeup()
        if self.auto_load and self.loading:
            t = min(t, min(self.loading.values()))
        return t

    def _answer_due(self) -> None:
        if not self.auto_load:
            return
        for rid, t in sorted(self.loading.items(), key=lambda kv: (kv[1], kv[0])):
            if t <= self.now:
                self._loaded(rid)

    def _loaded(self, rid: str) -> None:
        assert rid in self.loading, f"{rid} is not loading"
        del self.loading[rid]
        self.ready.add(rid)
        self.loaded_at[rid] = self.now
        self.sched.loaded(rid, self.now)
        self._check()

    def _apply_load(self, d: Load) -> None:
        assert d.replica_id not in self.replica_model, f"{d.replica_id} loaded twice"
        spec = self.inv.models.get(d.model)
        assert spec is not None, f"load of unknown model {d.model}"
        if d.wake:  # a replica put to sleep, woken where it slept, in its wake time
            assert self.asleep.pop(d.replica_id, None) == (d.model, d.gpu_ids), f"{d}: not asleep there"
            assert d.load_s == spec.wake_s, d
        else:
            assert d.load_s == spec.load_s, d
        assert len(d.gpu_ids) == spec.gpus == len(set(d.gpu_ids)), d
        gpus = {g.id: g for g in self.inv.gpus}
        assert len({gpus[g].node for g in d.gpu_ids}) == 1, f"{d} spans nodes"
        # not loaded twice for the same demand: the replicas of the model loading
        # (before this step, and loaded earlier in it) leave queued requests unserved
        loading = sum(spec.slots for r in self.loading if self.replica_model[r] == d.model)
        queued = self._queued_before.get(d.model, 0)
        assert queued > loading, f"{d}: {queued} queued, {loading} slots already loading"
        (self.wakes if d.wake else self.loads).append((self.now, d))
        self.loading[d.replica_id] = self.now + d.load_s
        self.replica_model[d.replica_id] = d.model
        self.replica_gpus[d.replica_id] = d.gpu_ids
        self._check_vram()

    def _apply_evict(self, d: Evict) -> None:
        rid = d.replica_id
        if rid in self.asleep:  # an asleep replica's engine stopped: it held no VRAM already
            assert not d.sleep and self.asleep.pop(rid) == (d.model, d.gpu_ids), d
            return
        assert rid in self.ready, f"{d}: not a ready replica (loading or unknown)"
        assert self.replica_model[rid] == d.model and self.replica_gpus[rid] == d.gpu_ids, d
        busy = [r for r, w in self.running.items() if w == rid]
        assert not busy, f"{d}: {busy} still run (or stop) there"
        assert not d.sleep or self.inv.models[d.model].wake_s is not None, f"{d}: its model cannot sleep"
        self.evictions.append((self.now, d))
        self.adapters.pop(rid, None)
        self.ready.discard(rid)
        del self.replica_model[rid]
        del self.replica_gpus[rid]
        if d.sleep:
            self.asleep[rid] = (d.model, d.gpu_ids)

    def _check_dispatch(self, d: Dispatch) -> None:
        self.dispatches.append((self.now, d))
        w = d.worker_id
        assert w in self.ready, f"{d}: to a replica that is not ready"
        model = self.model_of[d.request_id]
        assert model is not None
        spec = self.inv.models[model]
        assert self.replica_model[w] == (spec.adapter_of or model), (
            f"{d}: replica of {self.replica_model[w]}, request for {model}"
        )
        if spec.adapter_of is not None:
            assert model in self.adapters.get(w, ()), f"{d}: adapter {model} not loaded there"
        cls = self.class_of[d.request_id]
        gpus = {g.id: g for g in self.inv.gpus}
        for gid in self.replica_gpus[w]:
            assert gpus[gid].admits(cls), f"{d}: P{cls} work on {gid}, reserved for {gpus[gid].reserved_for}"

    def _apply_load_adapter(self, d: LoadAdapter) -> None:
        self.adapter_loads.append((self.now, d))
        rid = d.replica_id
        spec = self.inv.models[d.adapter]
        assert rid in self.ready, f"{d}: not a ready replica"
        assert spec.adapter_of == self.replica_model[rid], f"{d}: not an adapter of {self.replica_model[rid]}"
        assert d.load_s == spec.load_s, d
        held = self.adapters.setdefault(rid, set())
        assert d.adapter not in held, f"{d}: held there already"
        held.add(d.adapter)
        limit = self.inv.models[self.replica_model[rid]].max_adapters
        assert len(held) <= limit, f"{d}: {sorted(held)} held, at most {limit}"

    def _apply_unload_adapter(self, d: UnloadAdapter) -> None:
        self.adapter_unloads.append((self.now, d))
        held = self.adapters.get(d.replica_id, set())
        assert d.adapter in held, f"{d}: not held there"
        busy = [r for r, w in self.running.items() if w == d.replica_id and self.model_of[r] == d.adapter]
        assert not busy, f"{d}: {busy} still run it there"
        held.discard(d.adapter)

    def _check_vram(self) -> None:
        held = self.held()
        for g in self.inv.gpus:
            used = held[g.id]
            assert used <= g.usable_gb + EPS, f"{g.id}: {used} GB held > {g.usable_gb} GB usable"
