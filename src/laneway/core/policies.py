"""Named scheduling policies: which mechanisms of the core are switched on.

- ``fifo``: one queue by arrival; no classes, no queue timeouts, no
  preemption — what an engine's own queue does (the baseline).
- ``priority``: strict classes, FIFO inside a class; no aging, no preemption.
- ``graceful``: classes with aging; preemption by *drain* only — wait for the
  soonest-finishing victim if it ends within the drain cap, else checkpoint.
- ``mlfq``: weighted class shares (work-conserving) with multi-level feedback:
  a request that uses up its time slice drops a level and yields its slot to
  shorter work of its class; preemption rights as in the class table.
- ``laneway``: the full default — classes, aging, preemption choosing per case
  the cheapest of drain, checkpoint and recompute.
- ``naive``: ``laneway``'s order and preemption with naive GPU placement — the
  first idle GPU that fits, no model affinity, no grouping (the baseline for
  GPU runs; on plain slots it is ``laneway``).
- ``round-robin`` / ``least-loaded``: ``laneway``'s order and preemption with work
  spread over upstreams in turn, or to the least loaded, blind to their prefix caches
  (the baselines for upstreams of several slots with prefix caches; elsewhere they
  are ``laneway``).
"""

from __future__ import annotations

from dataclasses import dataclass

from laneway.core.classes import ClassTable
from laneway.core.errors import ConfigError
from laneway.core.modes import PreemptionMode
from laneway.core.placement import SPREADS

PREEMPTION_MODES = tuple(m.value for m in PreemptionMode)


@dataclass(frozen=True, slots=True)
class PolicySpec:
    name: str
    classes: bool = True  # False: one FIFO lane for everything
    aging: bool = True
    preemption: PreemptionMode = PreemptionMode.AUTO  # (a string of its values is taken too)
    shares: bool = False  # weighted class shares instead of strict order
    feedback: bool = False  # time-slice demotion (multi-level feedback)
    timeouts: bool = True  # per-class queue timeouts
    placement: str = "affinity"  # on GPUs: "affinity" (resident first, grouping) or "naive"
    # over workers of several slots: how work spreads (one of placement.SPREADS); None:
    # the configuration's ([scheduler] placement)
    spread: str | None = None

    def __post_init__(self) -> None:
        if self.preemption not in PREEMPTION_MODES:
            raise ValueError(f"preemption must be one of {PREEMPTION_MODES}")
        object.__setattr__(self, "preemption", PreemptionMode(self.preemption))
        if self.spread is not None and self.spread not in SPREADS:
            raise ValueError(f"spread must be one of {SPREADS}")
        if self.feedback and not self.classes:
            raise ValueError("feedback (time-slice demotion) needs class lanes: classes=True")


POLICIES: dict[str, PolicySpec] = {
    "fifo": PolicySpec("fifo", classes=False, aging=False, preemption=PreemptionMode.NONE, timeouts=False),
    "priority": PolicySpec("priority", aging=False, preemption=PreemptionMode.NONE),
    "graceful": PolicySpec("graceful", preemption=PreemptionMode.DRAIN),
    "mlfq": PolicySpec("mlfq", aging=True, preemption=PreemptionMode.AUTO, shares=True, feedback=True),
    "laneway": PolicySpec("laneway"),
    "naive": PolicySpec("naive", placement="naive"),
    "round-robin": PolicySpec("round-robin", spread="round-robin"),
    "least-loaded": PolicySpec("least-loaded", spread="least-loaded"),
}


def compared(name: str, *, gpus: bool, caches: bool) -> bool:
    """Whether ``name`` differs from ``laneway`` on such a run: a GPU-placement baseline
    only on a GPU fleet, a spread baseline only on upstreams with prefix caches."""
    spec = POLICIES[name]
    if spec.placement == "naive":
        return gpus
    if spec.spread is not None:
        return caches
    return True


def policy(name: str | PolicySpec) -> PolicySpec:
    if isinstance(name, PolicySpec):
        return name
    try:
        return POLICIES[name]
    except KeyError:
        raise ConfigError(f"unknown policy {name!r}: choose one of {', '.join(POLICIES)}") from None


def stoppable_classes(classes: ClassTable, name: str | PolicySpec) -> frozenset[int]:
    """The classes whose running work the policy may stop (and later resume): those some
    class may preempt, or any preemptible one under feedback; none where the policy
    never stops running work (``fifo``, ``priority``). (``graceful`` drains first but
    preempts a victim that would not end within its drain cap.)"""
    spec = policy(name)
    if spec.feedback:
        return frozenset(c.rank for c in classes.classes if c.preemptible)
    if spec.preemption is PreemptionMode.NONE:
        return frozenset()
    return frozenset(v for victims in classes.victims() for v in victims)
