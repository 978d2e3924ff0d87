"""Counters the core keeps, and a snapshot of its gauges (Prometheus-ready)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Counters:
    """What the scheduler counts as it goes. Submissions are its sequence number
    and completions its service-time samples (:class:`~laneway.core.estimate.ServiceStats`)."""

    n_classes: int
    dispatched: int = 0
    resumed: int = 0
    drains: int = 0
    model_loads: int = 0
    failed: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    preemptions: list[int] = field(default_factory=list)  # by victim class
    rejections: Counter[str] = field(default_factory=Counter)  # by reason

    def __post_init__(self) -> None:
        for name in ("failed", "cancelled", "preemptions"):
            setattr(self, name, [0] * self.n_classes)


@dataclass(frozen=True)
class Snapshot:
    """Gauges and counters at one instant, keyed by class name where per class."""

    queue_depth: dict[str, int]
    running: dict[str, int]
    slots_total: int
    slots_free: int
    submitted: int
    dispatched: int
    drains: int
    completed: dict[str, int]
    preemptions: dict[str, int]
    rejections: dict[str, int]
    model_loads: int = 0
    model_evictions: int = 0
    # GPU fleets only, keyed by GPU id: VRAM held by replicas (GB), total VRAM (GB)
    # and the models resident (loading or ready)
    vram_used_gb: dict[str, float] = field(default_factory=dict)
    vram_total_gb: dict[str, float] = field(default_factory=dict)
    loaded_models: dict[str, list[str]] = field(default_factory=dict)
    asleep_models: dict[str, list[str]] = field(default_factory=dict)  # (their engines' sleep mode)
    # placement by prefix only, keyed by worker: the share of the prompt blocks sent there
    # that placement expected it to hold (its expected prefix-cache hit rate)
    prefix_hits: dict[str, float] = field(default_factory=dict)
