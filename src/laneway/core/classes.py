"""Priority classes: names, queue timeouts, preemption rights (DESIGN §2).

A class is identified by its *rank*: 0 is the most urgent. The default table
has four classes, P0–P3; names, count, timeouts and rights are configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from laneway.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """One priority class.

    ``may_preempt`` holds the ranks of the classes whose running, preemptible
    requests this class may preempt. ``preemptible`` says whether running work
    of this class may be preempted at all (P0 and P1 never are by default).
    ``timeout_s`` is the default queue timeout; ``None`` means none.
    """

    name: str
    rank: int
    timeout_s: float | None
    may_preempt: frozenset[int] = frozenset()
    preemptible: bool = True
    max_queued: int | None = None
    weight: float = 1.0  # share under the weighted-shares (mlfq) policy
    # the service a request of the class is expected to need until some are measured (None:
    # the scheduler's default_service_s, or what other classes measured)
    service_s: float | None = None


def _default_classes() -> tuple[PriorityClass, ...]:
    return (
        PriorityClass("P0", 0, 30.0, frozenset({2, 3}), preemptible=False, weight=8.0),
        PriorityClass("P1", 1, 60.0, frozenset({3}), preemptible=False, weight=4.0),
        PriorityClass("P2", 2, 300.0, frozenset(), preemptible=True, weight=2.0),
        PriorityClass("P3", 3, None, frozenset(), preemptible=True, weight=1.0),
    )


@dataclass(frozen=True)
class ClassTable:
    """The ordered set of classes; ``classes[i].rank == i``."""

    classes: tuple[PriorityClass, ...] = field(default_factory=_default_classes)

    def __post_init__(self) -> None:
        if not self.classes:
            raise ConfigError("classes: at least one class is required")
        names: set[str] = set()
        for i, c in enumerate(self.classes):
            if c.rank != i:
                raise ConfigError(f"classes[{i}].rank: expected {i}, got {c.rank}")
            if c.name in names:
                raise ConfigError(f"classes[{i}].name: duplicate name {c.name!r}")
            names.add(c.name)
            if c.timeout_s is not None and c.timeout_s <= 0:
                raise ConfigError(f"classes.{c.name}.timeout_s: must be > 0 or none")
            if c.weight <= 0:
                raise ConfigError(f"classes.{c.name}.weight: must be > 0")
            if c.max_queued is not None and c.max_queued < 1:
                raise ConfigError(f"classes.{c.name}.max_queued: must be >= 1 or none")
            for r in c.may_preempt:
                if not (0 <= r < len(self.classes)) or r <= i:
                    raise ConfigError(
                        f"classes.{c.name}.may_preempt: a class may only preempt "
                        f"less urgent classes (got rank {r})"
                    )

    def __len__(self) -> int:
        return len(self.classes)

    def __getitem__(self, rank: int) -> PriorityClass:
        return self.classes[rank]

    def victims(self) -> tuple[tuple[int, ...], ...]:
        """Per class, the preemptible classes it may preempt (ranks, ascending)."""
        return tuple(
            tuple(sorted(v for v in c.may_preempt if self.classes[v].preemptible)) for c in self.classes
        )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.classes)

    def parse(self, value: object) -> int:
        """Turn ``2``, ``2.0``, ``"2"``, ``"P2"`` or ``"p2"`` into a rank; ``ValueError`` otherwise."""
        n = len(self.classes)
        if isinstance(value, bool):
            raise ValueError(f"priority must be 0–{n - 1} or a class name, got {value!r}")
        if isinstance(value, float) and value.is_integer():  # some JSON encoders write 2 as 2.0
            value = int(value)
        if isinstance(value, int):
            if 0 <= value < n:
                return value
            raise ValueError(f"priority {value} is out of range 0–{n - 1}")
        if isinstance(value, str):
            text = value.strip()
            for c in self.classes:
                if c.name.lower() == text.lower():
                    return c.rank
            if text.isascii() and text.isdigit():  # (int() would also read '٣' and '３')
                return self.parse(int(text))
        raise ValueError(f"unknown priority {value!r}: expected 0–{n - 1} or one of {', '.join(self.names)}")
