"""The preemption step: who stops for whom, and how.

For each class with preemption rights that needs more slots than free and promised ones,
:class:`Preemptor` gathers the running requests it may preempt (:mod:`laneway.core.victims`
chooses among them: lowest class first, then least work lost), and either claims the
victim's slot and lets it drain (it ends soon) or stops it now, by checkpoint or by
recompute (:func:`~laneway.core.victims.preempt_mode`). A drain that outlives its deadline
becomes a preemption. On GPU fleets, a class whose model fits nowhere has replicas of
other models cleared for it (:meth:`Preemptor.room_for`).

What it promised is in :class:`~laneway.core.promises.Promises`; what it decided goes out
as :class:`~laneway.core.decisions.Preempt`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from laneway.core.config import SchedulerConfig
from laneway.core.decisions import Decision, Preempt
from laneway.core.lanes import Lanes
from laneway.core.measures import Measures
from laneway.core.modes import PreemptionMode, StopMode
from laneway.core.occupancy import Occupancy
from laneway.core.placement import SlotPlacement
from laneway.core.promises import Promises
from laneway.core.request import Request, State, transition
from laneway.core.selection import NONE_BLOCKED, Selector
from laneway.core.stats import Counters
from laneway.core.tables import Tables
from laneway.core.victims import (
    Candidate,
    choose_action,
    gather_candidates,
    may_stop_again,
    on_worker,
    preempt_mode,
)

if TYPE_CHECKING:
    from laneway.core.affinity import AffinityStops
    from laneway.core.gpu_placement import GpuPlacement
    from laneway.core.prefill_guard import PrefillGuard

_RUNNING = State.RUNNING
_PREEMPTED = State.PREEMPTED


class Preemptor:
    __slots__ = (
        "by_cache",
        "cfg",
        "counters",
        "guard",
        "lanes",
        "measures",
        "occ",
        "planner",
        "promises",
        "reqs",
        "selector",
        "stops",
        "tables",
    )

    def __init__(
        self,
        tables: Tables,
        cfg: SchedulerConfig,
        reqs: Mapping[str, Request],
        lanes: Lanes,
        occ: Occupancy,
        promises: Promises,
        selector: Selector,
        measures: Measures,
        counters: Counters,
        planner: GpuPlacement | None,
    ) -> None:
        self.tables = tables
        self.cfg = cfg
        self.reqs = reqs
        self.lanes = lanes
        self.occ = occ
        self.promises = promises
        self.selector = selector
        self.measures = measures
        self.counters = counters
        self.planner = planner
        # whether the placement models prefix caches (a victim where the waiting prompt is)
        placement = occ.placement
        self.by_cache = isinstance(placement, SlotPlacement) and placement.index is not None
        # stops made for a waiting request's cache (laneway.core.affinity: set by assembly)
        self.stops: AffinityStops | None = None
        # urgent long prefills kept apart (laneway.core.prefill_guard: set by assembly)
        self.guard: PrefillGuard | None = None

    # ------------------------------------------------------------------ the step
    def step(self, now: float, out: list[Decision]) -> None:
        """Claim or stop victims for every class that needs slots (only while some running
        work may be preempted and something waits: the scheduler checks)."""
        count = self.lanes.class_count
        running = self.occ.running
        promises = self.promises
        incoming = promises.incoming
        reserved = promises.reserved
        tables = self.tables
        for c in tables.rights:
            need = count[c] - incoming[c] - reserved[c]  # promises.need(c, count[c]), inline
            if self.stops is not None and self.occ.free > 0 and self.stops.pending(c, now):
                need -= self.occ.free  # (its head waits for a stop made for its cache; the rest, for these)
            if need <= 0:
                continue
            victims = tables.victims[c]
            for v in victims:
                if running[v]:
                    break
            else:
                continue  # nothing it may preempt is running
            if promises.barren[c] == self.occ.changes:
                continue  # searched in vain and no slot changed hands since
            mode = tables.preemption
            cap = self.cfg.drain_cap_s
            model = None
            head: Request | None = None
            if len(self.lanes.models) > 1:  # requests name models: victims must serve it
                head = self.selector.best_in_class(c, now, NONE_BLOCKED)
                model = head.model if head is not None else None
            # the slot freed where the next to start has its prompt cached, if it is anywhere
            cached: str | None = None
            if self.by_cache:
                if head is None:
                    head = self.selector.best_in_class(c, now, NONE_BLOCKED)
                cached = self.occ.placement.holder_of(head) if head is not None and head.prefix else None
            guard = self.guard
            if guard is not None and guard.guards and head is None:
                head = self.selector.best_in_class(c, now, NONE_BLOCKED)
            while need > 0:
                cands = self.candidates(victims, model, now, c)
                if guard is not None and guard.guards and head is not None:  # (a slot it may take)
                    workers = self.occ.workers
                    cands = [x for x in cands if guard.fits(head, workers[x.worker_id], now)]
                action = choose_action(on_worker(cands, cached), mode, cap)
                if action is None:
                    if self.planner is not None and self.room_for(c, now, out):
                        need -= 1
                        continue
                    promises.barren[c] = self.occ.changes
                    break
                victim = self.reqs[action.victim.request_id]
                promises.claim(victim, c)
                if action.kind == "drain":
                    wait = cap if mode is PreemptionMode.DRAIN else action.victim.eta_s + action.victim.lost_s
                    # stop draining in time for the waiting request to start before it expires
                    if head is None:
                        head = self.selector.best_in_class(c, now, NONE_BLOCKED)
                    latest = head.deadline_s - action.victim.lost_s if head is not None else math.inf
                    promises.drain(victim, max(now, min(now + wait, latest)))
                    self.counters.drains += 1
                else:
                    assert isinstance(action.mode, StopMode)
                    self.stop(victim, action.mode, c, now, out)
                need -= 1

    def may_stop(self, req: Request, now: float) -> bool:
        """Whether running ``req`` may be preempted now (nobody claimed it, it and its class
        are preemptible, its preemptions have not cost it too much yet)."""
        cfg = self.cfg
        return (
            req.state is _RUNNING
            and req.claimed_for is None
            and req.preemptible
            and self.tables.preemptible[req.cls]
            and may_stop_again(req, now, cfg.max_preempt_loss, cfg.max_preemptions)
        )

    def candidates(
        self, victims: tuple[int, ...], model: str | None, now: float, cls: int
    ) -> list[Candidate]:
        cfg = self.cfg
        return gather_candidates(
            self.occ.running,
            victims,
            self.occ.workers,
            model,
            now,
            self.measures.costs,
            cfg.max_preempt_loss,
            cfg.max_preemptions,
            cls,
            self.planner.helps(model) if self.planner is not None else None,
        )

    def stop(self, victim: Request, mode: StopMode, for_class: int, now: float, out: list[Decision]) -> None:
        """Preempt ``victim`` now by ``mode`` for a request of ``for_class``."""
        transition(victim, _PREEMPTED)
        victim.preempt_at_s = now
        victim.preemptions += 1
        checkpoint_s, recompute_s = self.measures.costs.round_trips(
            victim.prompt_tokens, victim.tokens_done, now - victim.started_s
        )
        victim.lost_s += checkpoint_s if mode is StopMode.CHECKPOINT else recompute_s
        victim.resume = mode
        self.promises.stopping(victim)
        self.counters.preemptions[victim.cls] += 1
        out.append(Preempt(victim.id, victim.worker, mode, for_class))  # type: ignore[arg-type]

    def cheapest_mode(self, req: Request, now: float) -> StopMode:
        """How to stop ``req`` now (:func:`~laneway.core.victims.preempt_mode`)."""
        checkpoint_s, recompute_s = self.measures.costs.round_trips(
            req.prompt_tokens, req.tokens_done, now - req.started_s
        )
        can = self.occ.workers[req.worker].spec.can_checkpoint  # type: ignore[index]
        return preempt_mode(self.tables.preemption, can, checkpoint_s, recompute_s)

    # ------------------------------------------------------------------ drains
    def overdue_drains(self, now: float, out: list[Decision]) -> None:
        """A drained victim that has not ended by its deadline is preempted, if
        its claimant class still needs the slot; otherwise the claim lapses."""
        count = self.lanes.class_count
        promises = self.promises
        for req in [r for r in promises.drains.values() if r.claim_deadline_s <= now]:
            c: int = req.claimed_for  # type: ignore[assignment]
            if promises.need(c, count[c]) < 0:
                promises.lapse(req)
                self.occ.changes += 1  # it may be a victim for someone else now
                continue
            self.stop(req, self.cheapest_mode(req, now), c, now, out)

    # ------------------------------------------------------------------ GPU fleets
    def lapsed_clearings(self, now: float) -> None:
        """A graceful clearing whose window passed: search again (and preempt).

        The lapsed window leaves a mark, ``(-inf, True)``, so that the search of
        this call preempts at once; a mark no search used (the request was
        served otherwise) is dropped at the next call, and a later need opens
        a new window."""
        clearing = self.promises.clearing
        for model, (until, drained) in list(clearing.items()):
            if until <= now:
                if drained and until != -math.inf:
                    clearing[model] = (-math.inf, True)  # ended draining: preempt now
                    self.occ.changes += 1
                else:  # a mark left unused, or a stopping window over
                    del clearing[model]

    def room_for(self, c: int, now: float, out: list[Decision]) -> bool:
        """GPU fleets: the head of class ``c`` fits nowhere and nothing it may
        preempt runs its model: clear replicas of other models to load it."""
        planner = self.planner
        assert planner is not None
        head = self.selector.best_in_class(c, now, NONE_BLOCKED)
        if head is None or head.model is None:
            return False
        clearing = self.promises.clearing
        until, drained = clearing.get(head.model, (0.0, False))
        if until > now:
            return False  # clearing for it already
        victims_of = self.tables.victims[c]
        victims = planner.make_room(head, now, lambda r: r.cls in victims_of and self.may_stop(r, now))
        if victims is None:
            return False
        load_s = planner.inv.base(head.model).load_s
        if self.tables.preemption is PreemptionMode.DRAIN and not drained:
            # graceful: let the victims end if they do so within the drain cap and
            # in time for the load to finish before the request's queue timeout
            window = min(self.cfg.drain_cap_s, head.deadline_s - now - load_s - 1.0)
            if window > 0 and all(
                max(v.est_s - v.run_s - (now - v.started_s), 0.0) <= window for v in victims
            ):
                clearing[head.model] = (now + window, True)
                return True
        clearing[head.model] = (now + planner.switch_wait_s, False)
        for v in victims:
            self.stop(v, self.cheapest_mode(v, now), c, now, out)
        return True
