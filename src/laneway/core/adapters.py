"""LoRA adapters in the replicas of their base: which each replica holds, where a request
for one runs, and the loads and unloads that takes.

A request for an adapter (``ModelSpec.adapter_of``) takes a slot of a ready replica of its
base that holds the adapter, else of one with room for it — fewer than ``max_adapters``
held, or one held that runs nothing (the least recently used of those is unloaded). Taking
it there queues ``LoadAdapter`` (after ``UnloadAdapter``) in :attr:`Adapters.pending`,
handed out before its ``Dispatch``. An adapter's queued requests count as demand for its
base (it is loaded, and kept, for them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from laneway.core.decisions import Decision, LoadAdapter, UnloadAdapter
from laneway.core.inventory import Inventory, ModelSpec
from laneway.core.placement import Filter, Scorer, choose
from laneway.core.replicas import MostFreeSlots, Replica
from laneway.core.request import Request
from laneway.core.workers import WorkerState


def adapters_running(r: Replica) -> set[str]:
    """The adapters that requests running on replica ``r`` use (the base's own are left out)."""
    base = r.model.name
    return {m for m in (x.model for x in r.worker.running.values()) if m is not None and m != base}


def adapter_room(r: Replica, held: dict[str, float] | None, adapter: str | None) -> bool:
    """Whether replica ``r`` (holding ``held``) holds ``adapter`` or has room for it: fewer
    adapters than its ``max_adapters``, or one that runs nothing (it would be unloaded)."""
    if held is None or adapter in held or len(held) < r.model.max_adapters:
        return True
    busy = {x.model for x in r.worker.running.values()}
    return any(a not in busy for a in held)


class AdapterRoom:
    """(A request for a LoRA adapter.) The replica holds the adapter, or has room for it:
    fewer adapters than ``max_adapters``, or one that runs nothing (it would be unloaded)."""

    def __init__(self, replicas: dict[str, Replica], resident: dict[str, dict[str, float]]) -> None:
        self.replicas = replicas
        self.resident = resident

    def fits(self, req: Request, w: WorkerState, now: float) -> bool:
        return adapter_room(self.replicas[w.id], self.resident.get(w.id), req.model)

    def ever(self, req: Request, w: WorkerState) -> bool:
        return True

    def why_never(self, req: Request) -> str:
        return "no replica has room for the adapter"


class AdapterResident:
    """(A request for a LoRA adapter.) A replica that holds it already first (no load)."""

    def __init__(self, resident: dict[str, dict[str, float]]) -> None:
        self.resident = resident

    def score(self, req: Request, w: WorkerState, now: float) -> float:
        held = self.resident.get(w.id)
        return 0.0 if held is not None and req.model in held else 1.0


class Adapters:
    """The adapters the replicas of a GPU placement hold (``replicas``: its replicas by id,
    ``filters``: what any slot of a replica must pass)."""

    def __init__(
        self, inventory: Inventory, replicas: dict[str, Replica], filters: tuple[Filter, ...]
    ) -> None:
        self.of = inventory.adapters  # each base model's adapters
        self.models = inventory.models
        self.replicas = replicas
        self.resident: dict[str, dict[str, float]] = {}  # replica -> adapter -> when last dispatched
        self.pending: list[Decision] = []  # the loads (unloads) the last slot taken needs
        self.loads = 0
        self.unloads = 0
        self.filters: tuple[Filter, ...] = (*filters, AdapterRoom(replicas, self.resident))
        self.scorers: tuple[Scorer, ...] = (AdapterResident(self.resident), MostFreeSlots())

    def spec(self, model: str | None) -> ModelSpec | None:
        """``model``'s spec if it is an adapter (``None`` for a base or an unknown model)."""
        if not self.of:
            return None
        spec = self.models.get(model)  # type: ignore[arg-type]
        return spec if spec is not None and spec.adapter_of is not None else None

    def of_base(self, base: str) -> tuple[str, ...]:
        """The adapters a replica of ``base`` serves too."""
        return self.of.get(base, ())

    def place(
        self, req: Request, adapter: ModelSpec, bases: Iterable[Replica], now: float
    ) -> WorkerState | None:
        """A slot for ``req`` of ``adapter`` among the replicas of its base (``bases``)."""
        ready = (r.worker for r in bases if r.ready)
        return choose(req, ready, self.filters, self.scorers, now)

    def hold(self, r: Replica, adapter: ModelSpec, now: float) -> None:
        """Replica ``r`` runs a request of ``adapter`` next: it holds it from now on (loaded
        there, after the least recently used adapter it holds that runs nothing, if full)."""
        held = self.resident.setdefault(r.id, {})
        if adapter.name not in held:
            if len(held) >= r.model.max_adapters:
                busy = adapters_running(r)
                victim = min((a for a in held if a not in busy), key=lambda a: (held[a], a))
                del held[victim]
                self.unloads += 1
                self.pending.append(UnloadAdapter(r.id, victim))
            self.loads += 1
            self.pending.append(LoadAdapter(r.id, adapter.name, adapter.load_s))
        held[adapter.name] = now

    def helps(self, model: str | None) -> Callable[[Request, str], bool] | None:
        """For a waiting request of ``model``: whether stopping a running request on a worker
        would let it start there — ``None`` (any would: the slot is what it waits for) but for
        an adapter, which may wait for room in its base's engine instead: then only a request
        of an adapter held there helps (stopping a base request frees a slot it has)."""
        if self.spec(model) is None:
            return None
        replicas, resident = self.replicas, self.resident

        def helps(victim: Request, worker_id: str) -> bool:
            r = replicas.get(worker_id)
            if r is None:
                return False
            held = resident.get(worker_id)
            if adapter_room(r, held, model):
                return r.worker.free == 0  # (only a slot is wanted)
            return held is not None and victim.model in held

        return helps

    def gone(self, replica_id: str, adapter: str) -> None:
        """``adapter`` is not in replica ``replica_id``'s engine after all (its load failed)."""
        self.resident.get(replica_id, {}).pop(adapter, None)

    def forget(self, replica_id: str) -> None:
        """Replica ``replica_id`` is asleep or stopped: its engine holds no adapter for us."""
        self.resident.pop(replica_id, None)

    def demand(self, demand: Callable[[str], int]) -> Callable[[str], int]:
        """``demand`` with each adapter's queued requests counted for its base too."""
        if not self.of:
            return demand
        adapters = self.of
        return lambda m: demand(m) + sum(demand(a) for a in adapters.get(m, ()))

    def check(self) -> None:
        """No replica holds more adapters than its ``max_adapters``, nor one that is gone."""
        for r in self.replicas.values():
            n = len(self.resident.get(r.id, ()))
            assert n <= r.model.max_adapters, f"{r.id} holds {n} adapters"
        assert self.resident.keys() <= self.replicas.keys(), "adapters held by a replica that is gone"
