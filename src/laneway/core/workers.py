"""Workers as the core sees them: a set of identical slots serving some models
(``None``: any) and some classes (``None``: any), and what runs on them now. Which
worker a request goes to is :mod:`laneway.core.placement`'s to say."""

from __future__ import annotations

from dataclasses import dataclass

from laneway.core.errors import ConfigError
from laneway.core.request import Request


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    id: str
    slots: int = 1
    models: frozenset[str] | None = None
    can_checkpoint: bool = True
    classes: frozenset[int] | None = None  # the classes it may run (reserved GPUs); None: any
    kv_tokens: int | None = None  # its engine's KV space in tokens (its prefix cache); None: not known
    isolate: bool = False  # urgent work runs there with nothing it may preempt beside it

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ConfigError(f"workers.{self.id}.slots: must be >= 1")
        if self.kv_tokens is not None and self.kv_tokens < 1:
            raise ConfigError(f"workers.{self.id}.kv_tokens: must be >= 1")

    def serves(self, model: str | None) -> bool:
        return model is None or self.models is None or model in self.models

    def admits(self, cls: int) -> bool:
        return self.classes is None or cls in self.classes


class WorkerState:
    __slots__ = ("calm", "cap_debt", "capped", "free", "held", "id", "prefill", "running", "spec")

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.id = spec.id
        self.running: dict[str, Request] = {}
        self.free = spec.slots
        self.held = 0  # slots in use outside this scheduler (Scheduler.hold)
        # prompt tokens its running requests likely still prefill: the sum of their
        # ``prefill_left`` (the prefix placement counts them until their first token)
        self.prefill = 0
        # slots its concurrency cap withholds (Scheduler.set_slots), and how many more it
        # withholds as running requests end
        self.capped = 0
        self.cap_debt = 0
        # isolated workers: class -> until when what it may preempt keeps off (it ended there)
        self.calm: dict[int, float] = {}

    @property
    def usable(self) -> int:
        """The slots it may use now: all but those its cap withholds."""
        return self.spec.slots - self.capped - self.cap_debt
