"""What the scheduler works out once, from its configuration, its policy and whether its
workers are all alike: a frozen table that every step reads and none writes.

Per class (by rank): which classes it may preempt, whose queued work goes ahead of it in
an estimate, its share weight, its queue bound, the wait past which an arrival is
refused; and the policy's switches (aging, preemption mode, shares, feedback).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from laneway.core.classes import PriorityClass
from laneway.core.config import SchedulerConfig
from laneway.core.modes import PreemptionMode
from laneway.core.policies import PolicySpec


@dataclass(frozen=True, slots=True)
class Tables:
    k: int  # classes
    names: tuple[str, ...]
    # --- preemption
    preemption: PreemptionMode  # the policy's
    preempting: bool  # preemption is not none
    rights: tuple[int, ...]  # the classes that may preempt some class
    victims: tuple[tuple[int, ...], ...]  # per class, the preemptible classes it may preempt
    exposed: tuple[int, ...]  # the classes some class may preempt
    rights_of: tuple[frozenset[int], ...]  # per class, the classes it may preempt (its table row)
    preemptible: tuple[bool, ...]
    # --- order
    single: bool  # one FIFO lane for everything (fifo)
    levels: int  # feedback levels (1: none)
    interval_s: float | None  # aging interval (None: no aging)
    ceilings: tuple[int, ...] | None  # per class, the most urgent rank it may age to
    shares: bool  # weighted class shares instead of strict order
    weights: tuple[float, ...]
    feedback: bool  # time-slice demotion
    slice_s: float  # the first level's time slice
    boost_s: float | None  # a demoted request rises a level per this much waiting
    # --- refusal
    max_queued: tuple[int | None, ...]
    max_queued_total: int | None
    timeouts: bool  # whether queue timeouts hold (the policy's; fifo has none)
    wait_limits: tuple[float | None, ...] | None  # per class, the expected wait refused at once
    bounded: bool  # whether any queue bound applies
    check_every: bool  # whether a request without a model may still be unplaceable
    gated: bool  # whether a request without a tenant or a model still needs admission
    # --- estimates
    est_rights: tuple[frozenset[int], ...]  # per class, what a new request of it may preempt
    est_ahead: tuple[tuple[int, ...], ...]  # per class, the classes whose queue goes first

    @classmethod
    def build(cls, cfg: SchedulerConfig, pol: PolicySpec, *, restricted: bool) -> Tables:
        """``restricted``: some worker serves only some classes, or placement loads models."""
        table = cfg.classes.classes
        k = len(table)
        max_queued = tuple(c.max_queued for c in table)
        wait_limits = (
            tuple(c.timeout_s if c.timeout_s is not None and pol.timeouts else cfg.max_wait_s for c in table)
            if cfg.max_wait_s is not None
            else None
        )
        bounded = (
            cfg.max_queued_total is not None
            or any(b is not None for b in max_queued)
            or wait_limits is not None
        )
        victims = cfg.classes.victims()
        interval = cfg.aging_interval_s if pol.aging else None
        # aging never lifts a request to a rank whose class may preempt it: it would be
        # dispatched only to be preempted at once
        ceilings = tuple(
            max([cfg.aging_ceiling] + [r + 1 for r in range(k) if c in table[r].may_preempt])
            for c in range(k)
        )
        single = not pol.classes
        preempting = pol.preemption is not PreemptionMode.NONE
        est_rights, est_ahead = estimate_tables(
            table, victims, preempting=preempting and not single, single=single, shares=pol.shares
        )
        return cls(
            k=k,
            names=cfg.classes.names,
            preemption=pol.preemption,
            preempting=preempting,
            rights=tuple(c for c in range(k) if table[c].may_preempt),
            victims=victims,
            exposed=tuple(sorted({v for vs in victims for v in vs})),
            rights_of=tuple(c.may_preempt for c in table),
            preemptible=tuple(c.preemptible for c in table),
            single=single,
            levels=cfg.mlfq_levels if pol.feedback else 1,
            interval_s=interval,
            ceilings=ceilings if interval is not None else None,
            shares=pol.shares,
            weights=tuple(c.weight for c in table),
            feedback=pol.feedback,
            slice_s=cfg.mlfq_slice_s,
            boost_s=cfg.mlfq_boost_s if pol.aging else None,
            max_queued=max_queued,
            max_queued_total=cfg.max_queued_total,
            timeouts=pol.timeouts,
            wait_limits=wait_limits,
            bounded=bounded,
            check_every=restricted,
            gated=restricted or bounded,
            est_rights=est_rights,
            est_ahead=est_ahead,
        )


def estimate_tables(
    table: Sequence[PriorityClass],
    victims: Sequence[tuple[int, ...]],
    *,
    preempting: bool,
    single: bool,
    shares: bool,
) -> tuple[tuple[frozenset[int], ...], tuple[tuple[int, ...], ...]]:
    """For each class: the classes a new request of it may preempt (``victims``
    when preemption applies), and the classes whose queued work dispatches
    before it (all under one queue; the more urgent ones and those that may
    preempt under shares; the more urgent ones under strict classes)."""
    k = len(table)
    rights = tuple(frozenset(victims[c]) if preempting else frozenset() for c in range(k))
    if single:
        ahead = tuple(tuple(range(k)) for _ in range(k))
    elif shares:
        ahead = tuple(tuple(a for a in range(c + 1) if a == c or table[a].may_preempt) for c in range(k))
    else:
        ahead = tuple(tuple(range(c + 1)) for c in range(k))
    return rights, ahead
