"""Wait estimates: what a new request of a class would wait, from the queue ahead,
running work and measured service times, with an interval and what it rests on.

:class:`Estimator` reads the scheduler's state through read-only views (the lanes'
counts, the occupancy, the measures) and changes none of it; the formulas it uses are
the pure functions of :mod:`laneway.core.wait_formulas`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from laneway.core.feedback import start_level
from laneway.core.measures import UNCALIBRATED, Measures, WaitRange
from laneway.core.modes import PreemptionMode
from laneway.core.request import Request
from laneway.core.tables import Tables
from laneway.core.victims import eta_of
from laneway.core.wait_formulas import end_span, first_end_median, start_after, wait_estimate
from laneway.core.workers import WorkerState

if TYPE_CHECKING:
    from laneway.core.gpu_placement import GpuPlacement
    from laneway.core.isolation import Isolation

EXACT_BLOCKING = 64  # up to this many running requests in its way, their own ends are used
EXACT_AHEAD = 64  # ... and with up to this many queued ahead, each one's turn on the slots
LONG_WAIT_S = 300.0  # a wait this long is stretched by urgent arrivals over the long window


class LanesView(Protocol):
    """What an estimate reads of the queues."""

    @property
    def class_count(self) -> Sequence[int]: ...
    @property
    def hint_work(self) -> Sequence[float]: ...
    @property
    def hint_count(self) -> Sequence[int]: ...
    @property
    def count(self) -> Sequence[int]: ...  # (per lane, where lane_counts)
    @property
    def lane_counts(self) -> bool: ...
    @property
    def models(self) -> Mapping[str | None, int]: ...
    @property
    def width(self) -> int: ...
    @property
    def levels(self) -> int: ...
    @property
    def single(self) -> bool: ...
    @property
    def ceilings(self) -> Sequence[int] | None: ...

    def queued_up_to(self, cls: int, level: int) -> int: ...


class OccupancyView(Protocol):
    """What an estimate reads of who runs where."""

    @property
    def running(self) -> Sequence[Mapping[str, Request]]: ...
    @property
    def end_sum(self) -> Sequence[float]: ...
    @property
    def fixed(self) -> Sequence[int]: ...
    @property
    def fixed_end_sum(self) -> Sequence[float]: ...
    @property
    def free(self) -> int: ...
    @property
    def held(self) -> int: ...
    @property
    def slots(self) -> int: ...
    @property
    def workers(self) -> Mapping[str, WorkerState]: ...


class Estimator:
    __slots__ = (
        "down",
        "drain_cap_s",
        "isolation",
        "lanes",
        "measures",
        "occ",
        "planner",
        "slice_s",
        "tables",
    )

    def __init__(
        self,
        tables: Tables,
        drain_cap_s: float,
        slice_s: float,
        lanes: LanesView,
        occ: OccupancyView,
        measures: Measures,
        down: set[str],
        planner: GpuPlacement | None,
        isolation: Isolation | None = None,
    ) -> None:
        self.tables = tables
        self.isolation = isolation  # (free slots of isolated workers are not free to all)
        self.drain_cap_s = drain_cap_s
        self.slice_s = slice_s
        self.lanes = lanes
        self.occ = occ
        self.measures = measures
        self.down = down  # (the placement's: workers out of service)
        self.planner = planner

    def available_for(self, model: str | None) -> bool:
        """Whether some worker that serves ``model`` is in placement (not taken out)."""
        down = self.down
        if not down:
            return True
        return any(w.spec.serves(model) and w.id not in down for w in self.occ.workers.values())

    def estimate_wait(
        self,
        cls: int,
        model: str | None,
        now: float,
        est_service_s: float | None = None,
        *,
        raw: bool = False,
    ) -> float:
        """Expected seconds a new class-``cls`` request would wait to start
        (``est_service_s``: its size hint, which places it under feedback),
        corrected by how such estimates compared with the waits that followed
        (``raw``: without that correction)."""
        if self.planner is not None and model is not None:
            t = self._estimate_on_gpus(cls, model, now)
        elif not self.available_for(model):
            return math.inf  # it cannot start before a worker for it is back
        else:
            serving = self._serving_only(model)
            if serving is not None:
                t = self._estimate_on_some(cls, model, serving, now)
            else:
                t = self._estimate_on_slots(cls, model, now, est_service_s)
        return t if raw else t * self.measures.calibration.factor[cls]

    def _serving_only(self, model: str | None) -> list[WorkerState] | None:
        """The workers that serve ``model`` (in placement), where not every worker does
        (several models on fixed slots); ``None`` where every one does. (Lanes count per
        lane exactly where workers serve different models: else nothing to look at.)"""
        if model is None or not self.lanes.lane_counts:
            return None
        workers = self.occ.workers.values()
        serving = [w for w in workers if w.spec.serves(model)]
        if len(serving) == len(workers):
            return None
        down = self.down
        return [w for w in serving if w.id not in down]

    def _estimate_on_some(self, cls: int, model: str | None, serving: list[WorkerState], now: float) -> float:
        """The wait for ``model`` where only ``serving`` serve it: their free slots, the
        requests running there it may not preempt, and the queue of its model in the
        classes that go first (those of other models wait for other workers)."""
        lanes = self.lanes
        tables = self.tables
        rights = tables.est_rights[cls]
        m = lanes.models.get(model)
        ahead = 0
        if m is not None and lanes.lane_counts:  # (kept where workers serve several models)
            if lanes.single:
                ahead = lanes.count[m]
            else:
                base, levels = m * lanes.width, lanes.levels
                ahead = sum(
                    lanes.count[base + c * levels + lv] for c in tables.est_ahead[cls] for lv in range(levels)
                )
        available = 0
        ends: list[float] = []
        for w in serving:
            available += w.free
            for r in w.running.values():
                if r.cls in rights and r.preemptible:
                    available += 1
                else:  # (overdue: as much again as it overran)
                    ends.append(abs(r.expected_end_s - now))
        if ahead < available:
            return 0.0
        return start_after(available, ends, ahead, self.measures.service.mean(cls, model))

    def estimate_range(
        self,
        cls: int,
        model: str | None,
        now: float,
        est_service_s: float | None = None,
    ) -> tuple[float, WaitRange]:
        """:meth:`estimate_wait` and its interval: where the wait falls 80 % of the time (the
        10th to 90th percentile), and what that rests on. Work ahead that has no size and
        whose class has no service measured yet makes the wait unknown: the interval has no
        upper bound, and says so (a P3 request behind long P3 jobs none of which has ended
        is not told seconds with confidence)."""
        raw = self.estimate_wait(cls, model, now, est_service_s, raw=True)
        point = raw * self.measures.calibration.factor[cls]
        if not math.isfinite(raw):
            return raw, WaitRange(raw, raw, "none", "no worker for it is up")
        name = self.tables.names[cls]
        unknown, configured = self._unsized(cls)
        calibrated = self.measures.calibration.range_of(cls, raw)
        if unknown:
            names = ", ".join(self.tables.names[c] for c in sorted(unknown))
            detail = f"{names} work ahead has no size and no {names} service was measured yet"
            return point, WaitRange(0.0, math.inf, "none", detail + ": the wait is not known")
        if raw <= 0.0:
            low, high = calibrated if calibrated is not None else (0.0, 0.0)
            return point, WaitRange(low, high, "now", "a slot is free for it now")
        if calibrated is not None and not configured:
            detail = f"the queue ahead, and how {name} estimates compared with the waits that followed"
            return point, WaitRange(calibrated[0], calibrated[1], "calibrated", detail)
        lo, hi = UNCALIBRATED
        if configured:
            names = ", ".join(self.tables.names[c] for c in sorted(configured))
            detail = f"{names} work ahead is sized by its configured service_s only"
            return point, WaitRange(point * lo, point * hi, "configured", detail)
        detail = f"the queue ahead and measured service times ({name} estimates not calibrated yet)"
        return point, WaitRange(point * lo, point * hi, "measured", detail)

    def _unsized(self, cls: int) -> tuple[set[int], set[int]]:
        """The classes of the work in the way of a new class-``cls`` request (queued ahead of
        it, or running where it may not preempt) that has no size of its own and whose class
        has no service measured: known by nothing (first), or by a configured prior only."""
        service = self.measures.service
        unknown: set[int] = set()
        configured: set[int] = set()

        def note(c: int) -> None:
            (configured if service.class_priors[c] is not None else unknown).add(c)

        lanes = self.lanes
        for c in self.tables.est_ahead[cls]:
            if service.n[c] == 0 and lanes.class_count[c] > lanes.hint_count[c]:
                note(c)
        rights = self.tables.est_rights[cls]
        for v, running in enumerate(self.occ.running):
            if v in rights or service.n[v] > 0 or not running:
                continue
            if any(r.est_service_s is None for r in running.values()):
                note(v)
        return unknown, configured

    def _drain_wait(self, rights: frozenset[int], ahead: tuple[int, ...], n: int, now: float) -> float:
        """Under drain-only preemption, when the ``n``-th slot it waits on frees. Victims
        claimed already (for the classes ahead of it) free theirs first, as they end.
        Each further need drains the soonest victim to end that is not claimed yet, if it
        ends within the drain cap (as the preemption search reckons its end), and preempts
        at once past the cap. Meanwhile a request it may not preempt may end first."""
        claimed: list[float] = []
        free: list[float] = []
        ends: list[float] = []
        for v, running in enumerate(self.occ.running):
            if v not in rights:
                if len(running) <= EXACT_BLOCKING:
                    ends += (abs(r.expected_end_s - now) for r in running.values())
                continue
            for r in running.values():
                if not r.preemptible:
                    continue
                eta = eta_of(r, now)
                if r.claimed_for is None:
                    free.append(eta)
                elif r.claimed_for in ahead:
                    claimed.append(eta)
        if n <= len(claimed):
            t = heapq.nsmallest(n, claimed)[-1]
        elif n - len(claimed) <= len(free):
            eta = heapq.nsmallest(n - len(claimed), free)[-1]
            t = eta if eta <= self.drain_cap_s else 0.0
        else:
            t = 0.0  # more needs than victims: as the general formula, which counts them free
        return min(t, heapq.nsmallest(n, ends)[-1]) if len(ends) >= n else t

    def _estimate_on_slots(
        self, cls: int, model: str | None, now: float, est_service_s: float | None
    ) -> float:
        lanes = self.lanes
        count = lanes.class_count
        mean = self.measures.service.mean
        tables = self.tables
        occ = self.occ
        rights = tables.est_rights[cls]
        ahead = 0
        work = 0.0
        for c in tables.est_ahead[cls]:
            n = count[c]
            if not n:
                continue
            # hinted work where given, the measured mean for the rest
            queued_work = lanes.hint_work[c] + (n - lanes.hint_count[c]) * mean(c)
            if c == cls and tables.feedback and est_service_s is not None:
                # only the class's queued work at its own level or shorter is ahead
                part = lanes.queued_up_to(c, start_level(lanes.levels, self.slice_s, est_service_s))
                ahead += part
                work += queued_work * part / n
            else:
                ahead += n
                work += queued_work
        available = occ.free + occ.held  # (held slots come back when asked: see hold)
        calm = math.inf  # (when the quiet time after urgent work on an isolated worker ends)
        if self.isolation is not None:
            kept = self.isolation.kept_from(cls, now)
            if kept:
                available -= kept
                # slots kept free after urgent work ended there free when its quiet time
                # ends (nothing running there need end first)
                calm = self.isolation.next_calm(now) - now
        blocking = 0
        remaining = 0.0
        end_sum = occ.end_sum
        for v, running in enumerate(occ.running):
            n = len(running)
            if not n:
                continue
            if v in rights:  # it may preempt them, but for those that may not be preempted
                fixed = occ.fixed[v]
                available += n - fixed
                if fixed:
                    blocking += fixed
                    remaining += abs(occ.fixed_end_sum[v] - fixed * now)
            else:
                blocking += n
                # past their expected ends on the whole, they are taken to need about as
                # much again as they overran (not to end at once); O(1) from the sums
                remaining += abs(end_sum[v] - n * now)
        k = ahead + 1 - available  # it starts when the k-th slot it cannot take frees
        if k <= 0 and rights and tables.preemption is PreemptionMode.DRAIN:
            n = ahead + 1 - occ.free - occ.held  # the slots it waits on victims for
            if n > 0:
                return self._drain_wait(rights, tables.est_ahead[cls], n, now)
        if k > 0 and blocking <= EXACT_BLOCKING and ahead <= EXACT_AHEAD and (ahead or blocking):
            # few enough to look at, one by one
            blockers = [
                r
                for v, running in enumerate(occ.running)
                for r in running.values()
                if v not in rights or not r.preemptible
            ]
            # the first of them to end (one not sized may end early or late)
            spread = self.measures.spread
            first = first_end_median([end_span(r, now, spread) for r in blockers]) if blockers else math.inf
            first = min(first, calm)
            if not ahead:
                t = first
            else:  # the queue ahead takes each slot as it frees, and frees it again after its service
                ends = [abs(r.expected_end_s - now) for r in blockers]  # (overdue: as much again)
                if calm < math.inf:
                    ends.append(calm)
                ends.sort()
                if ends:
                    ends[0] = min(ends[0], first)
                t = start_after(available, ends, ahead, work / ahead)
        elif 0 < k <= blocking <= EXACT_BLOCKING:
            # when the k-th of them is expected to end
            ends = [
                abs(r.expected_end_s - now)  # (overdue: as much again as it overran)
                for v, running in enumerate(occ.running)
                for r in running.values()
                if v not in rights or not r.preemptible
            ]
            t = heapq.nsmallest(k, ends)[-1]
        else:
            t = wait_estimate(
                slots=occ.slots,
                available=available,
                ahead=ahead,
                ahead_work_s=work,
                blocking=blocking,
                blocking_remaining_s=remaining,
                mean_service_s=mean(cls, model),
                urgent_load=0.0,
            )
        if cls and t > 0 and not lanes.single and occ.slots:
            # more urgent work arriving meanwhile takes its share of the slots: as it
            # arrived lately for a short wait, over a longer past for a long one
            arrivals = self.measures.arrivals
            rate_of = arrivals.rate_before if t < LONG_WAIT_S else arrivals.long_rate_before
            rate = rate_of(cls, now)
            ceilings = lanes.ceilings
            if ceilings is not None and ceilings[cls] < cls:
                # aging: the classes it rises into go ahead of it only with what arrives
                # within (classes risen) x the interval after it; those above the ceiling always
                top = ceilings[cls]
                always = rate_of(top, now)
                horizon = (cls - top) * tables.interval_s  # type: ignore[operator]
                rate = always + (rate - always) * min(1.0, horizon / t)
            t /= 1.0 - min(rate / occ.slots, 0.9)
        iso = self.isolation
        if iso is not None and iso.stops and ahead and cls in iso.exposed:
            # on isolated workers urgent work keeps this class off all their slots while it
            # runs there: the queue ahead drains no faster than the slots it left free lately
            kept_lately = iso.kept_share(cls) * iso.slots
            t = max(t, work / max(occ.slots - kept_lately, 0.1 * occ.slots))
        return t

    def _estimate_on_gpus(self, cls: int, model: str, now: float) -> float:
        """The wait for ``model``'s replicas: its queue ahead over its slots, after
        the rest of a load when no replica of it is ready."""
        planner = self.planner
        assert planner is not None
        spec = planner.inv.models.get(model)
        if spec is None:
            return 0.0
        cold = 0.0
        if spec.adapter_of is not None:  # (its base's replicas serve it, once it is loaded there)
            held = planner.adapters.resident
            if not any(model in held.get(r.id, ()) for r in planner.by_model.get(spec.adapter_of, ())):
                cold = spec.load_s
            spec = planner.inv.models[spec.adapter_of]
        reps = planner.by_model.get(spec.name, [])
        ready = [r for r in reps if r.ready]
        if not ready:
            loading = [r.ready_at for r in reps if not r.ready]
            if loading:
                cold += max(min(loading) - now, 0.0)
            else:  # (one asleep wakes in its wake time, where there is room)
                asleep = spec.wake_s is not None and planner.asleep_of(spec.name)
                cold += spec.wake_s if asleep and spec.wake_s is not None else spec.load_s
        slots = sum(r.model.slots for r in ready) or spec.slots
        running = sum(len(r.worker.running) for r in ready)
        free = sum(r.worker.free for r in ready if not r.draining)
        lanes = self.lanes
        m = lanes.models.get(model)
        ahead = 0
        if m is not None:
            base = m * lanes.width
            ahead = sum(lanes.count[base : base + (cls + 1) * lanes.levels])
        mean = self.measures.service.mean(cls, model)
        return cold + wait_estimate(
            slots=slots,
            available=free,
            ahead=ahead,
            ahead_work_s=ahead * mean,
            blocking=running,
            blocking_remaining_s=running * mean / 2,
            mean_service_s=mean,
            urgent_load=0.0,
        )
