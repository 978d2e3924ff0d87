"""The messages of a cluster's fleet, a replica to the leader: which node a replica owns,
its engines ready or gone, models and adapters that fail, preloads to load again
(:mod:`laneway.cluster.fleet_book` reads them; :mod:`laneway.cluster.fleet_replica`
sends them). On the wire as every event is (:mod:`laneway.cluster.codec`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from laneway.cluster.flat import Flat


@dataclass(frozen=True, slots=True)
class Owns(Flat):
    """Replica ``home`` starts the engines of the fleet's node ``node``."""

    TAG: ClassVar[str] = "n"
    node: str
    home: str


@dataclass(frozen=True, slots=True)
class EngineReady(Flat):
    """The engine of fleet replica ``replica`` (``model`` on ``gpus``) is ready after
    ``took_s`` (``wake``: woken from sleep; ``preload``: started with its owner); every
    replica reaches it through ``PREFIX engines``, written before."""

    TAG: ClassVar[str] = "e"
    replica: str
    model: str
    gpus: tuple[str, ...]
    took_s: float
    wake: bool = False
    preload: bool = False

    def to_wire(self) -> list[Any]:
        return [self.replica, self.model, list(self.gpus), self.took_s, self.wake, self.preload]

    @classmethod
    def from_wire(cls, items: list[Any]) -> EngineReady:
        r, m, g, t, *rest = items
        return cls(str(r), str(m), tuple(str(x) for x in g), float(t), *(bool(x) for x in rest[:2]))


@dataclass(frozen=True, slots=True)
class EngineGone(Flat):
    """Fleet replica ``replica``'s engine (of ``model``) is gone without an eviction (its
    launch failed, it died; ``asleep``: while asleep)."""

    TAG: ClassVar[str] = "z"
    replica: str
    model: str
    asleep: bool = False


@dataclass(frozen=True, slots=True)
class ModelFailing(Flat):
    """``model`` (or an adapter) could not be started (``reason``): its requests are refused
    for ``backoff_s``, on every replica."""

    TAG: ClassVar[str] = "b"
    model: str
    reason: str
    backoff_s: float


@dataclass(frozen=True, slots=True)
class AdapterTook(Flat):
    """A load of LoRA ``adapter`` took ``seconds``."""

    TAG: ClassVar[str] = "y"
    adapter: str
    seconds: float


@dataclass(frozen=True, slots=True)
class AdapterFailed(Flat):
    """LoRA ``adapter`` could not be loaded into fleet replica ``replica``."""

    TAG: ClassVar[str] = "j"
    replica: str
    adapter: str


@dataclass(frozen=True, slots=True)
class Reload(Flat):
    """Preloaded ``model`` lost its replica: one is to be loaded again."""

    TAG: ClassVar[str] = "r"
    model: str
