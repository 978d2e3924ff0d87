"""Workers as the core sees them, and the placement seam.

Here a worker is a set of identical slots serving some models (``None``: any).
:class:`Placement` is the seam GPU-aware placement plugs into: it answers
"this worker", "not now" (``None``) or "never" (:meth:`Placement.never` gives
the reason).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from laneway.core.errors import ConfigError
from laneway.core.request import Request


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    id: str
    slots: int = 1
    models: frozenset[str] | None = None
    can_checkpoint: bool = True
    classes: frozenset[int] | None = None  # the classes it may run (reserved GPUs); None: any

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ConfigError(f"workers.{self.id}.slots: must be >= 1")

    def serves(self, model: str | None) -> bool:
        return model is None or self.models is None or model in self.models

    def admits(self, cls: int) -> bool:
        return self.classes is None or cls in self.classes


class WorkerState:
    __slots__ = ("free", "id", "running", "spec")

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.id = spec.id
        self.running: dict[str, Request] = {}
        self.free = spec.slots


class Placement(Protocol):
    def place(self, req: Request, now: float) -> WorkerState | None:
        """A worker with a free slot for ``req`` now, or ``None`` (not now)."""

    def never(self, req: Request) -> str | None:
        """Why no worker could ever run ``req``; ``None`` if some could."""

    def slot_freed(self, worker: WorkerState) -> None: ...

    def slot_taken(self, worker: WorkerState) -> None: ...

    def set_available(self, worker: WorkerState, available: bool) -> None:
        """Take ``worker`` out of placement (it failed) or back in (it recovered)."""


class SlotPlacement:
    """The worker idle longest (configuration order at start) that serves the model."""

    def __init__(self, workers: Sequence[WorkerState]) -> None:
        self.workers = list(workers)
        self._free: dict[str, WorkerState] = {w.id: w for w in self.workers if w.free > 0}
        self.down: set[str] = set()  # workers out of placement until they recover
        # every worker serves every model and class: any free one will do
        self._open = all(w.spec.models is None and w.spec.classes is None for w in self.workers)

    def place(self, req: Request, now: float) -> WorkerState | None:
        if self._open:
            return next(iter(self._free.values()), None)
        for w in self._free.values():
            if w.spec.serves(req.model) and w.spec.admits(req.cls):
                return w
        return None

    def never(self, req: Request) -> str | None:
        fits = [w for w in self.workers if w.spec.serves(req.model)]
        if not fits:
            return f"no worker serves model {req.model!r}"
        if not any(w.spec.admits(req.priority) for w in fits):
            return f"no worker serving model {req.model!r} may run class rank {req.priority}"
        return None

    def slot_freed(self, worker: WorkerState) -> None:
        if worker.free == 1 and worker.id not in self.down:
            self._free[worker.id] = worker  # idle longest is tried first

    def slot_taken(self, worker: WorkerState) -> None:
        if worker.free == 0:
            del self._free[worker.id]

    def set_available(self, worker: WorkerState, available: bool) -> None:
        if available:
            self.down.discard(worker.id)
            if worker.free > 0:
                self._free.setdefault(worker.id, worker)
        else:
            self.down.add(worker.id)
            self._free.pop(worker.id, None)
