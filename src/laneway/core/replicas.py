"""A replica: one loaded copy of a model on one GPU, or on several GPUs of one
node, which the scheduler sees as a worker serving that model.
"""

from __future__ import annotations

from laneway.core.inventory import GpuSpec, ModelSpec
from laneway.core.workers import WorkerSpec, WorkerState


class Replica:
    __slots__ = ("classes", "draining", "gpus", "id", "last_used", "model", "ready", "ready_at", "worker")

    def __init__(self, rid: str, model: ModelSpec, gpus: tuple[str, ...], classes: frozenset[int] | None):
        self.id = rid
        self.model = model
        self.gpus = gpus
        self.classes = classes
        self.ready = False
        self.ready_at = 0.0  # when its load is expected to end
        self.draining = 0.0  # until when no new work is placed here (0: not draining)
        self.last_used = 0.0
        self.worker = WorkerState(WorkerSpec(rid, model.slots, frozenset({model.name}), True, classes))

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
