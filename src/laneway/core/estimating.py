"""Wait estimates: what a new request of a class would wait, from the queue
ahead, running work and measured service times (the formula is
:func:`laneway.core.estimate.wait_estimate`).

A mixin of :class:`~laneway.core.scheduler.Scheduler`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from laneway.core.classes import PriorityClass
from laneway.core.estimate import (
    UNCALIBRATED,
    SizeSpread,
    WaitRange,
    first_end_median,
    start_after,
    wait_estimate,
)
from laneway.core.preemption import eta_of
from laneway.core.request import Request, State

_RUNNING = State.RUNNING
EXACT_BLOCKING = 64  # up to this many running requests in its way, their own ends are used
EXACT_AHEAD = 64  # ... and with up to this many queued ahead, each one's turn on the slots
LONG_WAIT_S = 300.0  # a wait this long is stretched by urgent arrivals over the long window


def estimate_tables(
    table: Sequence[PriorityClass],
    victims: Sequence[tuple[int, ...]],
    *,
    preempting: bool,
    single: bool,
    shares: bool,
) -> tuple[list[frozenset[int]], list[tuple[int, ...]]]:
    """For each class: the classes a new request of it may preempt (``victims``
    when preemption applies), and the classes whose queued work dispatches
    before it (all under one queue; the more urgent ones and those that may
    preempt under shares; the more urgent ones under strict classes)."""
    k = len(table)
    rights = [frozenset(victims[c]) if preempting else frozenset() for c in range(k)]
    if single:
        ahead = [tuple(range(k)) for _ in range(k)]
    elif shares:
        ahead = [tuple(a for a in range(c + 1) if a == c or table[a].may_preempt) for c in range(k)]
    else:
        ahead = [tuple(range(c + 1)) for c in range(k)]
    return rights, ahead


class Estimating:
    __slots__ = ()  # the scheduler's attributes are slots (see Scheduler)

    def progress(self, request_id: str, tokens: int, now: float) -> None:
        """A running request has made ``tokens`` output tokens so far (over all its
        runs): its expected end follows its own pace toward its size
        (``output_tokens``). Requests without a size are left as they are."""
        req = self._reqs.get(request_id)
        if req is None:
            return
        if self.fair is not None and req.tenant is not None:  # tokens are charged as they come
            self.fair.charge(req, tokens)
        if req.tenant is not None and tokens > req.tokens_charged:
            self.admission.charge_tokens(req.tenant, req.priority, tokens - req.tokens_charged, now)
            req.tokens_charged = tokens
        if req.state is not _RUNNING or req.output_tokens <= 0:
            return
        ran = now - req.started_s
        made = tokens - req.tokens_done  # in this run
        if made <= 0 or ran <= 0:
            return
        left_s = max(req.output_tokens - tokens, 0) * ran / made
        end = now + left_s
        self._end_sum[req.cls] += end - req.expected_end_s
        req.expected_end_s = end
        req.est_s = req.run_s + ran + left_s
        if req.lost_s:
            self._changes += 1  # (its size bounds its preemptions: victim searches look again)

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
        if self._planner is not None and model is not None:
            t = self._estimate_on_gpus(cls, model, now)
        elif not self.available_for(model):
            return math.inf  # it cannot start before a worker for it is back
        else:
            t = self._estimate_on_slots(cls, model, now, est_service_s)
        return t if raw else t * self.calibration.factor[cls]

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
        point = raw * self.calibration.factor[cls]
        if not math.isfinite(raw):
            return raw, WaitRange(raw, raw, "none", "no worker for it is up")
        name = self.classes.classes[cls].name
        unknown, configured = self._unsized(cls)
        calibrated = self.calibration.range_of(cls, raw)
        if unknown:
            names = ", ".join(self.classes.classes[c].name for c in sorted(unknown))
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
            names = ", ".join(self.classes.classes[c].name for c in sorted(configured))
            detail = f"{names} work ahead is sized by its configured service_s only"
            return point, WaitRange(point * lo, point * hi, "configured", detail)
        detail = f"the queue ahead and measured service times ({name} estimates not calibrated yet)"
        return point, WaitRange(point * lo, point * hi, "measured", detail)

    def _unsized(self, cls: int) -> tuple[set[int], set[int]]:
        """The classes of the work in the way of a new class-``cls`` request (queued ahead of
        it, or running where it may not preempt) that has no size of its own and whose class
        has no service measured: known by nothing (first), or by a configured prior only."""
        service = self.service
        unknown: set[int] = set()
        configured: set[int] = set()

        def note(c: int) -> None:
            (configured if service.class_priors[c] is not None else unknown).add(c)

        lanes = self.lanes
        for c in self._est_ahead[cls]:
            if service.n[c] == 0 and lanes.class_count[c] > lanes.hint_count[c]:
                note(c)
        rights = self._est_rights[cls]
        for v, running in enumerate(self._running):
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
        for v, running in enumerate(self._running):
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
            t = eta if eta <= self.cfg.drain_cap_s else 0.0
        else:
            t = 0.0  # more needs than victims: as the general formula, which counts them free
        return min(t, heapq.nsmallest(n, ends)[-1]) if len(ends) >= n else t

    def _estimate_on_slots(
        self, cls: int, model: str | None, now: float, est_service_s: float | None
    ) -> float:
        lanes = self.lanes
        count = lanes.class_count
        mean = self.service.mean
        rights = self._est_rights[cls]
        ahead = 0
        work = 0.0
        for c in self._est_ahead[cls]:
            n = count[c]
            if not n:
                continue
            # hinted work where given, the measured mean for the rest
            queued_work = lanes.hint_work[c] + (n - lanes.hint_count[c]) * mean(c)
            if c == cls and self.pol.feedback and est_service_s is not None:
                # only the class's queued work at its own level or shorter is ahead
                part = lanes.queued_up_to(c, self._start_level(est_service_s))
                ahead += part
                work += queued_work * part / n
            else:
                ahead += n
                work += queued_work
        available = self._free + self._held  # (held slots come back when asked: see hold)
        blocking = 0
        remaining = 0.0
        for v, running in enumerate(self._running):
            n = len(running)
            if not n:
                continue
            if v in rights:
                available += n
            else:
                blocking += n
                # past their expected ends on the whole, they are taken to need about as
                # much again as they overran (not to end at once); O(1) from the sums
                remaining += abs(self._end_sum[v] - n * now)
        k = ahead + 1 - available  # it starts when the k-th slot it cannot take frees
        if k <= 0 and rights and self.pol.preemption == "drain":
            n = ahead + 1 - self._free - self._held  # the slots it waits on victims for
            if n > 0:
                return self._drain_wait(rights, self._est_ahead[cls], n, now)
        if k > 0 and blocking <= EXACT_BLOCKING and ahead <= EXACT_AHEAD and (ahead or blocking):
            # few enough to look at, one by one
            blockers = [
                r for v, running in enumerate(self._running) if v not in rights for r in running.values()
            ]
            # the first of them to end (one not sized may end early or late)
            spread = self.spread
            first = first_end_median([_end_span(r, now, spread) for r in blockers]) if blockers else math.inf
            if not ahead:
                t = first
            else:  # the queue ahead takes each slot as it frees, and frees it again after its service
                ends = sorted(abs(r.expected_end_s - now) for r in blockers)  # (overdue: as much again)
                if ends:
                    ends[0] = min(ends[0], first)
                t = start_after(available, ends, ahead, work / ahead)
        elif 0 < k <= blocking <= EXACT_BLOCKING:
            # when the k-th of them is expected to end
            ends = [
                abs(r.expected_end_s - now)  # (overdue: as much again as it overran)
                for v, running in enumerate(self._running)
                if v not in rights
                for r in running.values()
            ]
            t = heapq.nsmallest(k, ends)[-1]
        else:
            t = wait_estimate(
                slots=self.slots,
                available=available,
                ahead=ahead,
                ahead_work_s=work,
                blocking=blocking,
                blocking_remaining_s=remaining,
                mean_service_s=mean(cls, model),
                urgent_load=0.0,
            )
        if cls and t > 0 and not lanes.single and self.slots:
            # more urgent work arriving meanwhile takes its share of the slots: as it
            # arrived lately for a short wait, over a longer past for a long one
            arrivals = self.arrivals
            rate_of = arrivals.rate_before if t < LONG_WAIT_S else arrivals.long_rate_before
            rate = rate_of(cls, now)
            ceilings = lanes.ceilings
            if ceilings is not None and ceilings[cls] < cls:
                # aging: the classes it rises into go ahead of it only with what arrives
                # within (classes risen) x the interval after it; those above the ceiling always
                top = ceilings[cls]
                always = rate_of(top, now)
                horizon = (cls - top) * self._interval  # type: ignore[operator]
                rate = always + (rate - always) * min(1.0, horizon / t)
            t /= 1.0 - min(rate / self.slots, 0.9)
        return t


def _end_span(r: Request, now: float, spread: SizeSpread) -> tuple[float, float]:
    """When a running request may end, from now. One that announced its size ends within
    its class's measured spread of the service it is expected to need, or when expected
    where none is measured yet (overdue: as much again as it overran, as below). Of one
    that did not, only its class's mean service is known: it may end any time before
    twice that mean (a service time uniform from 0 to twice it) or, once it ran past the
    mean, before twice its overrun."""
    ran = now - r.started_s + r.run_s
    if r.est_service_s is not None:
        within = spread.ranges[r.priority]
        if within is not None:
            latest = within[1] * r.est_s - ran
            if latest > 0.0:
                return max(within[0] * r.est_s - ran, 0.0), latest
        left = abs(r.expected_end_s - now)
        return left, left
    return 0.0, max(2.0 * r.est_s - ran, 2.0 * (ran - r.est_s), 1e-3)
