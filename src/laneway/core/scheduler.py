"""The scheduler: events in, decisions out.

Drive it with a clock value on every call:

- :meth:`Scheduler.submit` admits a request (or returns a :class:`Reject`);
- :meth:`Scheduler.finished`, :meth:`Scheduler.preempted` and
  :meth:`Scheduler.cancel` report what happened on the workers;
- :meth:`Scheduler.schedule` returns the decisions to apply now
  (:class:`Dispatch`, :class:`Preempt`, :class:`Reject`);
- :meth:`Scheduler.next_wakeup` says when to call ``schedule`` again if
  nothing else happens (timeouts, drain limits, time slices).

No I/O, no threads, no clock of its own: the simulator and the server drive
the same object.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from laneway.core.admission import Admission
from laneway.core.config import SchedulerConfig
from laneway.core.decisions import Decision, Dispatch, Reject
from laneway.core.errors import InvalidTransition, LanewayError, UnknownRequest
from laneway.core.estimate import (
    CALIBRATE_AFTER,
    CALIBRATE_EVERY,
    ArrivalRates,
    Calibration,
    ServiceStats,
    SizeSpread,
)
from laneway.core.estimating import Estimating, estimate_tables
from laneway.core.expiry import Expiry
from laneway.core.fairness import FairShares
from laneway.core.gpu_placement import GpuPlacement
from laneway.core.gpu_scheduling import GpuScheduling
from laneway.core.inheritance import Inheriting
from laneway.core.inspection import Inspecting
from laneway.core.lanes import Lanes
from laneway.core.policies import PolicySpec, policy
from laneway.core.preempting import Preempting
from laneway.core.refusing import Refusing
from laneway.core.request import Request, State, transition
from laneway.core.selecting import Selecting
from laneway.core.selection import NONE_BLOCKED, select_strict
from laneway.core.stats import Counters
from laneway.core.worker_failures import WorkerFailures
from laneway.core.workers import Placement, SlotPlacement, WorkerSpec, WorkerState

_NEW = State.NEW
_RUNNING = State.RUNNING
_PREEMPTED = State.PREEMPTED
_QUEUED = State.QUEUED
_FINISHED = State.FINISHED
_FAILED = State.FAILED
_new_tuple = tuple.__new__  # builds a named tuple without the Python-level __new__


class Scheduler(
    Preempting, GpuScheduling, Inheriting, Estimating, Inspecting, Refusing, Selecting, WorkerFailures
):
    # Every attribute is a slot (the mixins declare none): past 30 keys an
    # instance dict loses CPython's fast attribute and method lookups, which the
    # hot path (submit, finished, schedule) makes dozens of per request.
    __slots__ = (
        "_awaited",
        "_barren",
        "_boost",
        "_bounded",
        "_changes",
        "_check_every",
        "_clearing",
        "_drains",
        "_end_sum",
        "_est_ahead",
        "_est_rights",
        "_exposed_running",
        "_feedback_on",
        "_free",
        "_gated",
        "_held",
        "_incoming",
        "_interval",
        "_max_queued",
        "_max_queued_total",
        "_now",
        "_pending",
        "_planner",
        "_preempting",
        "_ranks",
        "_reqs",
        "_reserved",
        "_reserved_total",
        "_rights",
        "_rights_of",
        "_running",
        "_seq",
        "_shares",
        "_slices",
        "_victims",
        "_wait_limits",
        "_weights",
        "admission",
        "arrivals",
        "calibration",
        "cfg",
        "classes",
        "costs",
        "counters",
        "expiry",
        "fair",
        "lanes",
        "placement",
        "pol",
        "service",
        "slots",
        "spread",
        "workers",
    )

    def __init__(
        self,
        workers: Sequence[WorkerSpec],
        config: SchedulerConfig | None = None,
        policy_name: str | PolicySpec = "laneway",
        placement: Placement | None = None,
    ) -> None:
        if not workers and (placement is None or not hasattr(placement, "plan")):
            raise LanewayError("at least one worker is required")
        self.cfg = cfg = config or SchedulerConfig()
        self.costs = cfg.costs  # moves toward the checkpoint costs workers report
        self.pol = policy(policy_name)
        self.classes = cfg.classes
        k = len(cfg.classes)
        self.workers = {spec.id: WorkerState(spec) for spec in workers}
        if len(self.workers) != len(workers):
            raise LanewayError("worker ids must be unique")
        self.placement: Placement = placement or SlotPlacement(list(self.workers.values()))
        # a placement that can load models (GpuPlacement) plans loads and evictions
        self._planner: GpuPlacement | None = placement if isinstance(placement, GpuPlacement) else None
        if self._planner is not None:  # replicas loaded at start-up take work at once
            for rid, rep in self._planner.replicas.items():
                if rep.ready:
                    self.workers[rid] = rep.worker
        # whether a request without a model may still be unplaceable
        self._check_every = self._planner is not None or any(w.classes is not None for w in workers)
        self.expiry = Expiry(
            [c.timeout_s for c in cfg.classes.classes],
            self.pol.timeouts,
            shedding=cfg.max_queued_total is not None,  # _shed_candidate looks at it only then
        )
        self.admission = Admission(cfg.tenants, cfg.default_tenant, cfg.classes.names)
        self.service = ServiceStats(
            k, cfg.default_service_s, class_priors=[c.service_s for c in self.classes.classes]
        )
        self.arrivals = ArrivalRates(k)
        self.calibration = Calibration(k)
        self.spread = SizeSpread(k)
        self.counters = Counters(k)
        self.slots = sum(w.spec.slots for w in self.workers.values())
        self._free = self.slots
        self._held = 0  # slots held for use outside this scheduler (WorkerFailures.hold)
        # tenants inside a class share by tokens (not under fifo: one queue, an engine's)
        self.fair: FairShares | None = (
            FairShares(
                k,
                {name: pol.weight for name, pol in cfg.tenants.items()},
                prompt_weight=cfg.fair_prompt_weight,
                output_weight=cfg.fair_output_weight,
                # (what its slots serve a second: the scale of the tags against arrival times)
                tokens_per_s=max(self.slots, 1)
                * cfg.costs.decode_tokens_s
                * max(cfg.fair_output_weight, 1e-9),
            )
            if cfg.fair_tenants and self.pol.classes
            else None
        )
        self._reqs: dict[str, Request] = {}
        self._seq = 0
        self._running: list[dict[str, Request]] = [{} for _ in range(k)]  # by class, start order
        self._end_sum = [0.0] * k  # sum of expected ends of running work, by class
        self._incoming = [0] * k  # slots promised to a class: victims draining or stopping
        self._reserved = [0] * k  # freed slots held for a class
        self._reserved_total = 0
        self._changes = 0  # bumped whenever a slot changes hands
        self._barren = [-1] * k  # _changes when a victim search for a class found none
        self._drains: dict[str, Request] = {}
        self._awaited: dict[str, set[str]] = {}  # ids not yet submitted -> live waiters
        # model -> (until when replicas are being cleared for it, by draining only?)
        self._clearing: dict[str, tuple[float, bool]] = {}
        self._now = 0.0  # the clock of the last schedule() call
        self._slices: list[tuple[float, int, float, Request]] = []
        self._pending: list[Decision] = []
        self._ranks = range(k)
        self._max_queued = [c.max_queued for c in cfg.classes.classes]
        self._max_queued_total = cfg.max_queued_total
        # whether any queue bound applies (submit checks them only then)
        self._bounded = cfg.max_queued_total is not None or any(b is not None for b in self._max_queued)
        # class -> the expected wait past which an arrival is refused (None: unbounded)
        self._wait_limits: tuple[float | None, ...] | None = (
            tuple(c.timeout_s if c.timeout_s is not None else cfg.max_wait_s for c in cfg.classes.classes)
            if cfg.max_wait_s is not None
            else None
        )
        self._bounded = self._bounded or self._wait_limits is not None
        # whether a request without a tenant or a model still needs _admit
        self._gated = self._check_every or self._bounded
        self._rights = [c for c in range(k) if cfg.classes[c].may_preempt]
        self._weights = [c.weight for c in cfg.classes.classes]
        self._rights_of = [c.may_preempt for c in cfg.classes.classes]
        self._interval = cfg.aging_interval_s if self.pol.aging else None
        # aging never lifts a request to a rank whose class may preempt it: it
        # would be dispatched only to be preempted at once
        ceilings = [
            max([cfg.aging_ceiling] + [r + 1 for r in range(k) if c in cfg.classes[r].may_preempt])
            for c in range(k)
        ]
        self.lanes = Lanes(
            k,
            cfg.mlfq_levels if self.pol.feedback else 1,
            not self.pol.classes,
            ceilings if self._interval is not None else None,
            lane_counts=self._planner is not None,  # GPU placement counts per model
        )
        table = cfg.classes.classes
        # the preemptible classes each class may preempt
        self._victims = list(cfg.classes.victims())
        # the classes some class may preempt: with none of them running, no preemption is possible
        exposed = sorted({v for victims in self._victims for v in victims})
        self._exposed_running = tuple(self._running[v] for v in exposed)
        self._preempting = self.pol.preemption != "none"
        self._feedback_on = self.pol.feedback
        self._shares = self.pol.shares
        self._est_rights, self._est_ahead = estimate_tables(
            table,
            self._victims,
            preempting=self._preempting and not self.lanes.single,
            single=self.lanes.single,
            shares=self._shares,
        )
        self._boost = cfg.mlfq_boost_s if self.pol.aging else None

    # ------------------------------------------------------------------ queries
    def get(self, request_id: str) -> Request:
        try:
            return self._reqs[request_id]
        except KeyError:
            raise UnknownRequest(f"unknown request {request_id!r}") from None

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._reqs

    @property
    def live(self) -> int:
        return len(self._reqs)

    @property
    def queued(self) -> int:
        return self.lanes.total

    @property
    def free_slots(self) -> int:
        return self._free

    # ------------------------------------------------------------------ events
    def submit(self, req: Request, now: float) -> Reject | None:
        """Admit ``req`` into its class queue, or refuse it."""
        if req.state is not _NEW:
            raise InvalidTransition(f"request {req.id} was already submitted")
        rid = req.id
        reqs = self._reqs
        if rid in reqs:
            raise LanewayError(f"request id {rid!r} is already live")
        cls = req.priority
        if cls not in self._ranks:
            raise LanewayError(f"request {rid}: unknown class rank {cls}")
        req.seq = self._seq  # _seq also counts submissions
        self._seq += 1
        req.cls = cls
        model = req.model
        tenant = req.tenant
        if tenant is not None or model is not None or self._gated:
            refused = self._admit(req, now)
            if refused is not None:
                return refused
        est = req.est_service_s
        if est is None:
            service = self.service
            if model is None:  # service.mean(cls), inline: the hot path
                est = service.means[cls]
                if est != est:  # NaN: the class is not measured yet
                    est = service.overall
            else:
                est = service.mean(cls, model)
        elif self._feedback_on:
            req.level = self._start_level(est)
        req.est_s = est
        if not req.seq % CALIBRATE_EVERY and self.service.n[cls] >= CALIBRATE_AFTER:
            # (estimated before it is queued: the wait ahead of it; and only once its class's
            # service was measured: an estimate on the prior would teach the prior's error)
            req.est_raw_s = self.estimate_wait(cls, model, now, req.est_service_s, raw=True)
            self.calibration.watch(req, cls, req.est_raw_s, now)
        arrivals = self.arrivals  # arrivals.add(cls, est, now), inline: the hot path
        if now // arrivals.bucket_s != arrivals.index:
            arrivals.roll(now)
        arrivals.cur[cls] += est
        fair = self.fair
        if fair is None or tenant is None:
            req.tag = req.arrival_s  # (FIFO by arrival, as a tenant within its share)
        else:
            req.tag = fair.tag(req, req.output_tokens or est * self.costs.decode_tokens_s)
        if tenant is not None:  # its token quota: the prompt and its size (max_tokens) now
            reserve = max(req.output_tokens, 0)
            self.admission.charge_tokens(tenant, cls, req.prompt_tokens + reserve, now)
            req.tokens_charged = reserve  # (settled when it ends: _settle)
        req.state = _QUEUED  # NEW -> QUEUED, checked on entry
        reqs[rid] = req
        req.enqueued_s = now
        self.lanes.push(req)
        self.expiry.add(req, now)
        if tenant is not None:
            self.admission.on_admit(tenant)
        if req.depends_on or self._awaited:
            self._inherit(req)
        return None

    def finished(
        self,
        request_id: str,
        now: float,
        *,
        failed: bool = False,
        tokens: int | None = None,
        prompt_tokens: int | None = None,
    ) -> None:
        """The worker ended the request (``failed=True`` if it errored) having made
        ``tokens`` output tokens (``None``: not told; its share is charged as expected)
        from a prompt of ``prompt_tokens`` (``None``: as estimated at submission; 0: the
        engine refused it before doing anything)."""
        try:
            req = self._reqs[request_id]
        except KeyError:
            raise UnknownRequest(f"unknown request {request_id!r}") from None
        if req.tenant is not None:
            self._settle(req, tokens, prompt_tokens, now)
        state = req.state
        if state is not _RUNNING:
            if state is not _PREEMPTED:
                raise InvalidTransition(f"request {request_id} is {state.value}, not running")
            # it ended before the preemption took effect
            req.preemptions -= 1
            self.counters.preemptions[req.cls] -= 1
        service = req.run_s + (now - req.started_s)
        self._release(req)
        # from RUNNING or PREEMPTED, checked above
        if failed:
            req.state = _FAILED
            self.counters.failed[req.priority] += 1
        else:
            req.state = _FINISHED
            self.service.record(req.priority, req.model, service)  # also counts completions
            if req.est_service_s is not None:
                self.spread.record(req.priority, service / req.est_s)
        if req.tenant is None and not req.depends_on:
            del self._reqs[request_id]  # _end(req) with nothing else to do: the hot path
        else:
            self._end(req)

    def cancel(self, request_id: str, now: float, *, tokens: int | None = None) -> bool:
        """Cancel a live request wherever it is, having made ``tokens`` output tokens
        (``None``: not told); ``False`` if it is not live. Its tenant is charged the
        tokens it made (token quota and fair share) as if it had ended."""
        req = self._reqs.get(request_id)
        if req is None:
            return False
        if req.tenant is not None:
            if tokens is None and req.state is _QUEUED and not req.run_s:
                tokens = 0  # never ran: what was charged for its output goes back
            self._settle(req, tokens, None, now)
        if req.state is _QUEUED:
            self._dequeue(req, now)
        else:
            self._release(req)
        transition(req, State.CANCELLED)
        self.counters.cancelled[req.priority] += 1
        self._end(req)
        return True

    # ------------------------------------------------------------------ decide
    def schedule(self, now: float) -> list[Decision]:
        """Decisions to apply now, in order."""
        self._now = now
        out = self._pending
        self._pending = []
        watching = self.calibration.watching
        if watching and now > watching[0][0]:
            self.calibration.overdue(now)
        if now >= self.expiry.next_due:
            for req in self.expiry.due(now):
                self._expire(req, now, out)
        if self._drains:
            self._overdue_drains(now, out)
        if self._clearing:
            self._lapsed_clearings(now)
        self._dispatch(now, out)
        if self._slices:
            self._feedback(now, out)
        if self._preempting and self.lanes.total:
            for running in self._exposed_running:
                if running:  # some running work may be preempted: look for waiting claimants
                    self._preempt(now, out)
                    break
        return out

    def next_wakeup(self) -> float:
        """Earliest time ``schedule`` has work to do without a new event (inf: none)."""
        expiry = self.expiry
        t = expiry.refresh() if expiry.stale else expiry.next_due
        for req in self._drains.values():
            t = min(t, req.claim_deadline_s)
        for until, drained in self._clearing.values():
            if drained and until > self._now:  # a drain window still open
                t = min(t, until)
        if self._planner is not None and self.lanes.total:
            t = min(t, self._gpu_wakeup())
        if self._slices:
            t = min(t, self._slices[0][0])
        return t

    # ------------------------------------------------------------------ state changes
    def _dequeue(self, req: Request, now: float) -> None:
        self.lanes.take(req)
        if req.deadline_s <= self.expiry.next_due:
            self.expiry.stale = True  # the earliest deadline may be gone with it
        req.queued_total_s += now - req.enqueued_s
        if req.tenant is not None:
            self.admission.on_dequeue(req.tenant)

    def _release(self, req: Request) -> None:
        """Free the slot held by a running or preempted request."""
        w = self.workers[req.worker]  # type: ignore[index]
        rid = req.id
        cls = req.cls
        self._changes += 1
        del w.running[rid]
        self._free += 1
        self.placement.free_slot(w)
        del self._running[cls][rid]
        self._end_sum[cls] -= req.expected_end_s
        req.worker = None
        c = req.claimed_for
        if c is not None:
            self._incoming[c] -= 1
            self._reserved[c] += 1
            self._reserved_total += 1
            req.claimed_for = None
            self._drains.pop(rid, None)

    def _settle(self, req: Request, tokens: int | None, prompt_tokens: int | None, now: float) -> None:
        """``req`` (a tenant's) ended having made ``tokens`` from a prompt of
        ``prompt_tokens`` (``None``: not told): its token quota, charged the estimates,
        is charged the rest or given some back, and its fair share follows."""
        charge = 0
        if prompt_tokens is not None:
            charge += prompt_tokens - req.prompt_tokens
            req.prompt_tokens = prompt_tokens
        if tokens is not None:
            charge += tokens - req.tokens_charged
            req.tokens_charged = tokens
        self.admission.charge_tokens(req.tenant, req.priority, charge, now)  # (0: nothing)
        if self.fair is not None:
            self.fair.ended(req, tokens)

    def _end(self, req: Request) -> None:
        del self._reqs[req.id]
        if req.tenant is not None:
            self.admission.on_end(req.tenant)
        for dep_id in req.depends_on:
            dep = self._reqs.get(dep_id)
            if dep is not None and dep.waiters:
                dep.waiters.discard(req.id)
                self._reclass(dep, set())
            awaited = self._awaited.get(dep_id)
            if awaited is not None:
                awaited.discard(req.id)
                if not awaited:
                    del self._awaited[dep_id]

    # ------------------------------------------------------------------ dispatch
    def _dispatch(self, now: float, out: list[Decision]) -> None:
        """Start queued requests while slots are free (or loads may be planned)."""
        blocked: set[int] = NONE_BLOCKED
        lanes = self.lanes
        planner = self._planner
        placement = self.placement
        while (self._free > 0 or planner is not None) and lanes.total:
            if self._reserved_total:
                req = self._reserved_head(now, blocked) or self._select(now, blocked)
            elif self._shares:
                req = self._select(now, blocked)
            else:  # self._select, inline: the hot path
                req = select_strict(lanes, now, blocked, self._interval)
            if req is None:
                return
            w = placement.take_slot(req, now) if self._free > 0 else None
            if w is None:
                if planner is not None:
                    self._plan_load(req, now, out)
                if blocked is NONE_BLOCKED:
                    blocked = set()
                blocked.add(req.lane)
                continue
            # start req on w; _dequeue(req, now) inline
            lanes.pop_head(req)
            expiry = self.expiry
            if req.deadline_s <= expiry.next_due:
                expiry.stale = True  # the earliest deadline may be gone with it
            req.queued_total_s += now - req.enqueued_s
            if req.tenant is not None:
                self.admission.on_dequeue(req.tenant)
            req.state = _RUNNING  # QUEUED -> RUNNING: only queued requests are selected
            counters = self.counters
            if req.first_start_s != req.first_start_s:  # NaN: never started
                req.first_start_s = now
                if req.est_raw_s == req.est_raw_s:  # an estimate to learn from
                    self.calibration.learn(req.priority, req.est_raw_s, now - req.arrival_s)
                    self.calibration.started(req, now - req.arrival_s)
            else:
                counters.resumed += 1
            req.started_s = now
            if req.tenant is not None and self.fair is not None:  # (others' tags are arrivals)
                self.fair.dispatched(req)
            self._changes += 1
            rid = req.id
            wid = w.id
            cls = req.cls
            left = req.est_s - req.run_s
            if left < 0.0:  # max(left, 0.0) without the call
                left = 0.0
            req.expected_end_s = end = now + left
            req.worker = wid
            w.running[rid] = req
            self._free -= 1
            if planner is not None:
                planner.touch(wid, now)
            self._running[cls][rid] = req
            self._end_sum[cls] += end
            counters.dispatched += 1
            out.append(_new_tuple(Dispatch, (rid, wid, req.resume)))  # Dispatch(rid, wid, req.resume)
            if self._feedback_on and self.classes.classes[cls].preemptible:
                slice_s = self.cfg.mlfq_slice_s * (2**req.level)
                heapq.heappush(self._slices, (now + slice_s, req.seq, now, req))
