"""Scheduler configuration: one frozen object, validated on construction."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from laneway.core.admission import TenantPolicy
from laneway.core.classes import ClassTable
from laneway.core.costs import CostModel
from laneway.core.errors import ConfigError
from laneway.core.placement import SPREADS

MAX_HOLD_S = 3600.0  # a slot kept for a class's next request: an hour at most
MAX_WAIT_S = 86_400.0  # the longest wait an arrival may be expected to wait: a day


@dataclass(frozen=True)
class SchedulerConfig:
    """Knobs of the policy core.

    - ``aging_interval_s``: a queued request's dispatch rank rises one class
      per interval of waiting (``None`` disables aging); it never rises above
      ``aging_ceiling`` (default P2: aged work reaches the batch class but never
      competes with online P0/P1 traffic, which may preempt it anyway; on the
      ``mixed`` scenario a ceiling of P1 gave P3 the same bound but P1 a p99
      wait 7x longer).
    - ``drain_cap_s``: drain only for victims expected to end within this.
    - ``max_preempt_loss``: how much of its service a request may lose to
      preemptions (the slot time of saving and restoring its checkpoint, or of
      computing its context again), as a share of its expected service; past
      it, it runs to the end. So however often urgent work arrives, a victim
      spends at most that share more slot time than it needs (no livelock),
      yet an urgent request does not wait for a victim that merely was
      preempted a few times before: with checkpoints a preemption costs well
      under a second, and a count cap (3) made P0 wait once every running
      batch job had used it up. ``None``: no bound.
    - ``max_preemptions``: optional hard cap on the count (``None``: none).
    - ``max_queued_total``: above it, arrivals shed the newest queued request
      of the least urgent class below theirs (or are refused if there is none).
    - ``max_wait_s``: an arrival whose expected wait is past its queue timeout
      (its own, else its class's, else this) is refused at once as
      ``overloaded``, with that estimate as its retry time, rather than queued
      to time out or to outlast its client. ``None``: no bound by the wait
      (the server's default is 120 s: see ``laneway.config``).
    - ``mlfq_slice_s`` / ``mlfq_levels``: time slice of the first feedback
      level (doubling per level) and the number of levels; ``mlfq_boost_s``:
      a demoted request waiting this long rises one level (no starvation).
    - ``default_service_s``: service time assumed before any is measured.
    - ``fair_tenants``: inside a class, tenants share by weight with a virtual
      token counter (:mod:`laneway.core.fairness`; ``fair_prompt_weight`` and
      ``fair_output_weight`` price a prompt and an output token); ``False``:
      FIFO by arrival inside a class.
    - ``hold_s``: when a request of a class that may preempt others ends, its slot is
      kept this long for that class's next request before work it would preempt may take
      it (:mod:`laneway.core.holds`; 0: not kept).
    - ``placement``: how work spreads over workers of fixed slots that may all take it:
      ``prefix`` (where its prompt is likely cached, unless that worker is much busier;
      else as ``least-loaded``), ``least-loaded`` (the one running the smallest share of
      its slots) or ``round-robin`` (in turn, whatever they run).
    - ``prefill_guard``: under placement by prefix, an urgent request prefilling a long
      prompt runs with no other long prefill beside it until its first token
      (:mod:`laneway.core.prefill_guard`).
    """

    classes: ClassTable = field(default_factory=ClassTable)
    aging_interval_s: float | None = 60.0
    aging_ceiling: int = 2
    drain_cap_s: float = 30.0
    hold_s: float = 0.0
    max_preempt_loss: float | None = 0.25
    max_preemptions: int | None = None
    max_queued_total: int | None = None
    max_wait_s: float | None = None
    costs: CostModel = field(default_factory=CostModel)
    tenants: Mapping[str, TenantPolicy] = field(default_factory=dict)
    default_tenant: TenantPolicy | None = None
    mlfq_slice_s: float = 10.0
    mlfq_levels: int = 4
    mlfq_boost_s: float | None = 900.0
    default_service_s: float = 10.0
    fair_tenants: bool = True
    fair_prompt_weight: float = 1.0
    fair_output_weight: float = 2.0
    placement: str = "prefix"
    prefill_guard: bool = True

    def __post_init__(self) -> None:
        if self.aging_interval_s is not None and self.aging_interval_s <= 0:
            raise ConfigError("aging_interval_s: must be > 0 (or none to disable aging)")
        if not 0 <= self.aging_ceiling < len(self.classes):
            raise ConfigError(f"aging_ceiling: must be a class rank 0–{len(self.classes) - 1}")
        if self.drain_cap_s < 0:
            raise ConfigError("drain_cap_s: must be >= 0")
        if not 0 <= self.hold_s <= MAX_HOLD_S:
            raise ConfigError(f"hold_s: must be 0–{MAX_HOLD_S:,g} s")
        if self.max_preemptions is not None and self.max_preemptions < 0:
            raise ConfigError("max_preemptions: must be >= 0 (or none)")
        if self.max_preempt_loss is not None and not self.max_preempt_loss >= 0:
            raise ConfigError("max_preempt_loss: must be >= 0 (or none)")
        if self.max_queued_total is not None and self.max_queued_total < 1:
            raise ConfigError("max_queued_total: must be >= 1")
        if self.max_wait_s is not None and not 0 < self.max_wait_s <= MAX_WAIT_S:
            raise ConfigError(f"max_wait_s: must be > 0 and at most {MAX_WAIT_S:,g} s (or none)")
        if self.mlfq_boost_s is not None and self.mlfq_boost_s <= 0:
            raise ConfigError("mlfq_boost_s: must be > 0 (or none)")
        if self.mlfq_slice_s <= 0 or self.mlfq_levels < 1:
            raise ConfigError("mlfq_slice_s must be > 0 and mlfq_levels >= 1")
        if self.default_service_s <= 0:
            raise ConfigError("default_service_s: must be > 0")
        if self.fair_prompt_weight < 0 or self.fair_output_weight < 0:
            raise ConfigError("fair_prompt_weight / fair_output_weight: must be >= 0")
        if self.placement not in SPREADS:
            raise ConfigError(f"placement: must be one of {', '.join(SPREADS)}, got {self.placement!r}")
        n = len(self.classes)
        for name, pol in self.tenants.items():
            ranks = set(pol.allowed or ()) | set(pol.quotas) | set(pol.token_quotas)
            if not pol.weight > 0:
                raise ConfigError(f"tenants.{name}.weight: must be > 0")
            if pol.default_class is not None:
                ranks.add(pol.default_class)
            bad = [r for r in ranks if not 0 <= r < n]
            if bad:
                raise ConfigError(f"tenants.{name}: unknown class rank {bad[0]}")
