"""A replica: one loaded copy of a model on one GPU, or on several GPUs of one
node, which the scheduler sees as a worker serving that model; and the rules
(:mod:`laneway.core.placement`'s filters and scorers) that choose among the ready
replicas of a model.
"""

from __future__ import annotations

from laneway.core.inventory import GpuSpec, ModelSpec
from laneway.core.request import Request
from laneway.core.workers import WorkerSpec, WorkerState


class Replica:
    __slots__ = ("classes", "draining", "gpus", "id", "last_used", "model", "ready", "ready_at", "worker")

    def __init__(
        self,
        rid: str,
        model: ModelSpec,
        gpus: tuple[str, ...],
        classes: frozenset[int] | None,
        adapters: tuple[str, ...] = (),  # the model's LoRA adapters: it serves them too
    ):
        self.id = rid
        self.model = model
        self.gpus = gpus
        self.classes = classes
        self.ready = False
        self.ready_at = 0.0  # when its load is expected to end
        self.draining = 0.0  # until when no new work is placed here (0: not draining)
        self.last_used = 0.0
        self.worker = WorkerState(
            WorkerSpec(rid, model.slots, frozenset({model.name, *adapters}), True, classes)
        )

    @property
    def idle(self) -> bool:
        return self.ready and not self.worker.running


def classes_of(gpus: list[GpuSpec]) -> frozenset[int] | None:
    """The classes a group of GPUs may serve: those every reserved GPU allows (None: any)."""
    out: frozenset[int] | None = None
    for g in gpus:
        if g.reserved_for is not None:
            out = g.reserved_for if out is None else out & g.reserved_for
    return out


class HasFreeSlot:
    """The replica has a slot free now (a replica is a worker of a few slots)."""

    def fits(self, req: Request, w: WorkerState, now: float) -> bool:
        return w.free > 0

    def ever(self, req: Request, w: WorkerState) -> bool:
        return True

    def why_never(self, req: Request) -> str:
        return "no replica has slots"


class InService:
    """The replica is in placement (not taken out as failing)."""

    def __init__(self, down: set[str]) -> None:
        self.down = down

    def fits(self, req: Request, w: WorkerState, now: float) -> bool:
        return w.id not in self.down

    def ever(self, req: Request, w: WorkerState) -> bool:
        return True

    def why_never(self, req: Request) -> str:
        return "no replica is in service"


class NotDraining:
    """The replica is not being drained for another model's load; a drain nobody needed
    after all (its window passed) ends here."""

    def __init__(self, replicas: dict[str, Replica]) -> None:
        self.replicas = replicas

    def fits(self, req: Request, w: WorkerState, now: float) -> bool:
        r = self.replicas[w.id]
        if r.draining:
            if now < r.draining:
                return False
            r.draining = 0.0  # nobody needed the room after all
        return True

    def ever(self, req: Request, w: WorkerState) -> bool:
        return True

    def why_never(self, req: Request) -> str:
        return "every replica drains"


class MostFreeSlots:
    """The replica with the most free slots."""

    def score(self, req: Request, w: WorkerState, now: float) -> float:
        return -w.free
