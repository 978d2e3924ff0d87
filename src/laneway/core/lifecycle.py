"""A request's life in the scheduler: admitted, started elsewhere (adopted), making
progress, preempted or queued again, and ended — each event's bookkeeping over the parts
that own the data (:mod:`laneway.core.assembly`). :class:`~laneway.core.scheduler.Scheduler`
hands these events here; what to start or stop next is decided by its steps."""

from __future__ import annotations

import math

from laneway.core.assembly import Parts
from laneway.core.decisions import Reject
from laneway.core.errors import InvalidTransition, LanewayError, UnknownRequest
from laneway.core.feedback import start_level
from laneway.core.measures import CALIBRATE_AFTER, CALIBRATE_EVERY
from laneway.core.modes import StopMode
from laneway.core.request import TRANSITIONS, Request, State, transition

_NEW = State.NEW
_RUNNING = State.RUNNING
_PREEMPTED = State.PREEMPTED
_QUEUED = State.QUEUED
_FINISHED = State.FINISHED
_FAILED = State.FAILED
_CANCELLED = State.CANCELLED
_INF = math.inf
_NEXT = TRANSITIONS


class Lifecycle:
    """The events of a request's life (:mod:`laneway.core.lifecycle`)."""

    __slots__ = (
        "_calibration",
        "_expiry",
        "_ranks",
        "_reqs",
        "_service",
        "admission",
        "counters",
        "estimator",
        "fair",
        "guard",
        "holds",
        "inheritance",
        "isolation",
        "lanes",
        "live_requests",
        "measures",
        "occupancy",
        "promises",
        "refusals",
        "tables",
    )

    def __init__(self, parts: Parts) -> None:
        self.tables = parts.tables
        self.occupancy = parts.occupancy
        self.lanes = parts.lanes
        self.promises = parts.promises
        self.measures = measures = parts.measures
        self.counters = parts.counters
        self.admission = parts.admission
        self.live_requests = parts.live_requests
        self.inheritance = parts.inheritance
        self.fair = parts.fair
        self.isolation = parts.isolation
        self.guard = parts.guard
        self.estimator = parts.estimator
        self.refusals = parts.refusals
        self.holds = parts.holds
        # (the parts' own objects, held here too for the hot path)
        self._calibration = measures.calibration
        self._service = measures.service
        self._reqs = parts.reqs
        self._ranks = range(parts.tables.k)
        self._expiry = parts.expiry

    def submit(self, req: Request, now: float) -> Reject | None:
        """Admit ``req`` into its class queue, or refuse it."""
        if req.state is not _NEW:
            raise InvalidTransition(f"request {req.id} was already submitted")
        rid = req.id
        reqs = self._reqs
        if rid in reqs:
            raise LanewayError(f"request id {rid!r} is already live")
        cls = req.priority
        tables = self.tables
        if cls not in self._ranks:
            raise LanewayError(f"request {rid}: unknown class rank {cls}")
        est = req.est_service_s
        timeout = req.timeout_s
        if (
            not abs(req.arrival_s) < _INF
            or not abs(now) < _INF
            or (est is not None and not 0 <= est < _INF)
            or (timeout is not None and not timeout >= 0)
        ):
            raise LanewayError(_bad_numbers(req, now))
        live = self.live_requests
        req.seq = live.seq  # live.number(req), inline: the hot path
        live.seq += 1
        req.cls = cls
        model = req.model
        tenant = req.tenant
        if tenant is not None or model is not None or tables.gated:
            refused = self.refusals.admit(req, now)
            if refused is not None:
                return refused
        service = self._service
        if est is None:
            if model is None:  # service.mean(cls), inline: the hot path
                est = service.means[cls]
                if est != est:  # NaN: the class is not measured yet
                    est = service.overall
            else:
                est = service.mean(cls, model)
        elif tables.feedback:
            req.level = start_level(tables.levels, tables.slice_s, est)
        req.est_s = est
        if not req.seq % CALIBRATE_EVERY and service.n[cls] >= CALIBRATE_AFTER:
            # (estimated before it is queued: the wait ahead of it; and only once its class's
            # service was measured: an estimate on the prior would teach the prior's error)
            req.est_raw_s = self.estimator.estimate_wait(cls, model, now, req.est_service_s, raw=True)
            self._calibration.watch(req, cls, req.est_raw_s, now)
        arrivals = self.measures.arrivals  # arrivals.add(cls, est, now), inline: the hot path
        if now // arrivals.bucket_s != arrivals.index:
            arrivals.roll(now)
        arrivals.cur[cls] += est
        fair = self.fair
        if fair is None or tenant is None:
            req.tag = req.arrival_s  # (FIFO by arrival, as a tenant within its share)
        else:
            req.tag = fair.tag(req, req.output_tokens or est * self.measures.costs.decode_tokens_s)
        if tenant is not None:  # its token quota: the prompt and its size (max_tokens) now
            reserve = max(req.output_tokens, 0)
            self.admission.charge_tokens(tenant, cls, req.prompt_tokens + reserve, now)
            req.tokens_charged = reserve  # (settled when it ends: _settle)
        if _QUEUED not in _NEXT[req.state]:  # transition(req, _QUEUED), inline: the hot path
            transition(req, _QUEUED)
        req.state = _QUEUED
        reqs[rid] = req
        req.enqueued_s = now
        self.lanes.push(req)
        self._expiry.add(req, now)
        if tenant is not None:
            self.admission.on_admit(tenant)
        if req.depends_on or self.inheritance.awaited:
            self.inheritance.inherit(req)
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
        reqs = self._reqs
        try:
            req = reqs[request_id]
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
        if self.isolation is not None and not failed:
            self.isolation.ended(req, self.occupancy.workers[req.worker], now)  # type: ignore[index]
        self.occupancy.release(req)  # self.release(req), inline: the hot path
        if req.claimed_for is not None:
            self.promises.freed(req)
        if self.holds.hold_s and not failed:
            self.holds.freed(req.priority, now)
        if failed:
            transition(req, _FAILED)
            self.counters.failed[req.priority] += 1
        else:
            if _FINISHED not in _NEXT[req.state]:  # transition(req, _FINISHED), inline: the hot path
                transition(req, _FINISHED)
            req.state = _FINISHED
            self._service.record(req.priority, req.model, service)  # also counts completions
            if req.est_service_s is not None:
                self.measures.spread.record(req.priority, service / req.est_s)
        if req.tenant is None and not req.depends_on:
            del reqs[request_id]  # live.end(req) with nothing else to do: the hot path
        else:
            self.live_requests.end(req)

    def preempted(
        self,
        request_id: str,
        now: float,
        *,
        tokens_done: int | None = None,
        checkpoint_bytes: int | None = None,
        save_s: float | None = None,
    ) -> None:
        """The worker stopped a preempted request and its slot is free.

        A worker that measures its checkpoint (``checkpoint_bytes``, and
        ``save_s`` the time the copy took) teaches the cost model used to
        choose victims and preemption modes.
        """
        req = self.live_requests.get(request_id)
        if req.state is not _PREEMPTED:
            raise InvalidTransition(f"request {request_id} is {req.state.value}, not preempted")
        ran = max(req.preempt_at_s - req.started_s, 0.0)
        req.run_s += ran
        measures = self.measures
        costs = measures.costs
        req.tokens_done = (
            tokens_done if tokens_done is not None else req.tokens_done + costs.generated_in(ran)
        )
        held = costs.tokens_held(req.prompt_tokens, req.tokens_done)
        if checkpoint_bytes is None:
            checkpoint_bytes = costs.checkpoint_bytes(held) if req.resume is StopMode.CHECKPOINT else 0
        elif checkpoint_bytes > 0 and req.prompt_tokens:
            measures.costs = costs.observed(checkpoint_bytes, held, save_s)
        req.checkpoint_bytes = checkpoint_bytes
        self.release(req)
        transition(req, _QUEUED)
        self.lanes.back(req, now)

    def cancel(self, request_id: str, now: float, *, tokens: int | None = None) -> bool:
        """Cancel a live request wherever it is, having made ``tokens`` output tokens
        (``None``: not told); ``False`` if it is not live. Its tenant is charged the
        tokens it made (token quota and fair share) as if it had ended."""
        live = self.live_requests
        req = live.reqs.get(request_id)
        if req is None:
            return False
        if req.tenant is not None:
            if tokens is None and req.state is _QUEUED and not req.run_s:
                tokens = 0  # never ran: what was charged for its output goes back
            self._settle(req, tokens, None, now)
        if req.state is _QUEUED:
            self.lanes.leave(req, now)
        else:
            self.release(req)
        transition(req, _CANCELLED)
        self.counters.cancelled[req.priority] += 1
        live.end(req)
        return True

    def progress(self, request_id: str, tokens: int, now: float) -> None:
        """A running request has made ``tokens`` output tokens so far (over all its
        runs): its expected end follows its own pace toward its size
        (``output_tokens``). Requests without a size are left as they are."""
        req = self.live_requests.reqs.get(request_id)
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
        self.occupancy.expect_end(req, now + left_s)
        req.est_s = req.run_s + ran + left_s
        if req.lost_s:
            self.occupancy.changes += 1  # (its size bounds its preemptions: victim searches look again)

    def first_token(self, request_id: str, now: float) -> bool:
        """A running request made its first output token: its prompt is prefilled (the
        prefix placement stops counting it as prefill its worker still has to do).
        Whether a scheduling step is due: it guarded its worker
        (:mod:`laneway.core.prefill_guard`), and what it kept off may start."""
        req = self.live_requests.reqs.get(request_id)
        if req is None or req.prefilled:
            return False
        guard = self.guard
        due = guard is not None and bool(guard.guards) and guard.ends(req)
        self.occupancy.prefilled(req)
        return due

    def requeue(self, request_id: str, now: float, *, failed: bool = False) -> None:
        """Its run stopped before the request produced anything: queue it again.

        It goes back to the head of its class (it keeps its arrival time) and
        starts afresh on whichever worker it is dispatched to next. ``failed``: its worker
        failed (not laneway's own stop, as a preemption or the saturation gate's taking back
        is): it waits its queue timeout again, counted from now, and is refused
        (``queue_timeout``) past it as any request queued too long.
        """
        req = self.live_requests.get(request_id)
        if req.state is _PREEMPTED:  # the failure came first: the preemption did not happen
            req.preemptions -= 1
            self.counters.preemptions[req.cls] -= 1
        elif req.state is _RUNNING:
            transition(req, _PREEMPTED)
        else:
            raise InvalidTransition(f"request {request_id} is {req.state.value}, not running")
        req.preempt_at_s = now
        req.resume = None
        self.preempted(request_id, now, tokens_done=0, checkpoint_bytes=0)
        if failed and req.state is _QUEUED:  # (it waits its queue timeout anew: laneway.core.expiry)
            req.started_s = math.nan  # (no run under way)
            self._expiry.again(req, now)

    def adopt(self, req: Request, worker_id: str, now: float) -> None:
        """Take in ``req`` as running on ``worker_id`` already (a new scheduler rebuilding
        the state of one that failed): it holds one of the worker's slots from ``now``,
        counts for its tenant, and ends, is preempted or cancelled like any running request."""
        if req.state is not _NEW:
            raise InvalidTransition(f"request {req.id} was already submitted")
        live = self.live_requests
        if req.id in live.reqs:
            raise LanewayError(f"request id {req.id!r} is already live")
        w = self.occupancy.adoptable(worker_id, req.id)
        live.number(req)
        cls = req.cls = req.priority
        req.est_s = (
            req.est_service_s if req.est_service_s is not None else self.measures.service.mean(cls, req.model)
        )
        transition(req, _RUNNING)
        req.first_start_s = req.started_s = now
        self.occupancy.adopt(req, w, now)
        live.reqs[req.id] = req
        if req.tenant is not None:
            self.admission.on_admit(req.tenant)
            self.admission.on_dequeue(req.tenant)

    def release(self, req: Request) -> None:
        """Free the slot held by a running or preempted request (to its claimant, if claimed)."""
        self.occupancy.release(req)
        if req.claimed_for is not None:
            self.promises.freed(req)

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


def _bad_numbers(req: Request, now: float) -> str:
    """What of ``req`` (or the clock) no scheduler can take: said before it is queued."""
    if not abs(req.arrival_s) < _INF:
        return f"request {req.id}: arrival_s must be a finite time, got {req.arrival_s}"
    if not abs(now) < _INF:
        return f"request {req.id}: now must be a finite time, got {now}"
    if req.est_service_s is not None and not 0 <= req.est_service_s < _INF:
        return f"request {req.id}: est_service_s must be a finite number >= 0, got {req.est_service_s}"
    return f"request {req.id}: timeout_s must be >= 0 (inf: none), got {req.timeout_s}"
