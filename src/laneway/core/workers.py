"""Workers as the core sees them, and the placement seam.

Here a worker is a set of identical slots serving some models (``None``: any).
:class:`Placement` is the seam GPU-aware placement plugs into: it answers
"this worker", "not now" (``None``) or "never" (:meth:`Placement.never` gives
the reason).
"""

from __future__ import annotations

from collections import deque
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
    __slots__ = ("free", "held", "id", "running", "spec")

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.id = spec.id
        self.running: dict[str, Request] = {}
        self.free = spec.slots
        self.held = 0  # slots in use outside this scheduler (Scheduler.hold)


class Placement(Protocol):
    def take_slot(self, req: Request, now: float) -> WorkerState | None:
        """A worker with a free slot for ``req`` now, that slot taken
        (``worker.free`` one lower); ``None``: not now."""

    def never(self, req: Request) -> str | None:
        """Why no worker could ever run ``req``; ``None`` if some could."""

    def free_slot(self, worker: WorkerState) -> None:
        """A slot of ``worker`` came free (``worker.free`` one higher)."""

    def set_available(self, worker: WorkerState, available: bool) -> None:
        """Take ``worker`` out of placement (it failed) or back in (it recovered)."""


class SlotPlacement:
    """The worker idle longest (configuration order at start) that serves the model."""

    def __init__(self, workers: Sequence[WorkerState]) -> None:
        self.workers = list(workers)
        # workers with a free slot, the one idle longest first
        self._free: deque[WorkerState] = deque(w for w in self.workers if w.free > 0)
        self.down: set[str] = set()  # workers out of placement until they recover
        # every worker serves every model and class: any free one will do
        self._open = all(w.spec.models is None and w.spec.classes is None for w in self.workers)

    def take_slot(self, req: Request, now: float) -> WorkerState | None:
        free = self._free
        if self._open:
            if not free:
                return None
            w = free[0]
        else:
            for w in free:
                if w.spec.serves(req.model) and w.spec.admits(req.cls):
                    break
            else:
                return None
        w.free -= 1
        if not w.free:
            free.remove(w)
        return w

    def never(self, req: Request) -> str | None:
        fits = [w for w in self.workers if w.spec.serves(req.model)]
        if not fits:
            return f"no worker serves model {req.model!r}"
        if not any(w.spec.admits(req.priority) for w in fits):
            return f"no worker serving model {req.model!r} may run class rank {req.priority}"
        return None

    def take(self, worker: WorkerState) -> None:
        """Take a slot of this very worker (a request found running there)."""
        worker.free -= 1
        if not worker.free and worker in self._free:
            self._free.remove(worker)

    def free_slot(self, worker: WorkerState) -> None:
        worker.free += 1
        if worker.free == 1 and worker.id not in self.down:
            self._free.append(worker)  # idle longest is tried first

    def set_available(self, worker: WorkerState, available: bool) -> None:
        if available:
            self.down.discard(worker.id)
            if worker.free > 0 and worker not in self._free:
                self._free.append(worker)
        else:
            self.down.add(worker.id)
            if worker in self._free:
                self._free.remove(worker)
