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
import math
from collections.abc import Sequence

from laneway.core.admission import Admission
from laneway.core.config import SchedulerConfig
from laneway.core.decisions import Decision, Dispatch, Evict, Preempt, Reject
from laneway.core.errors import InvalidTransition, LanewayError, UnknownRequest
from laneway.core.estimate import ArrivalRates, ServiceStats, wait_estimate
from laneway.core.expiry import Expiry
from laneway.core.gpu_placement import GpuPlacement
from laneway.core.lanes import Lanes
from laneway.core.policies import PolicySpec, policy
from laneway.core.preemption import Candidate, choose_action, gather_candidates
from laneway.core.request import Request, State, transition
from laneway.core.selection import best_in_class, select_share, select_strict
from laneway.core.stats import Counters, Snapshot
from laneway.core.workers import Placement, SlotPlacement, WorkerSpec, WorkerState

_NEW = State.NEW
_RUNNING = State.RUNNING
_PREEMPTED = State.PREEMPTED
_QUEUED = State.QUEUED
_FINISHED = State.FINISHED
_FAILED = State.FAILED
_NONE_BLOCKED: set[int] = set()  # shared and never written: no lane is blocked
OVERRUN = 1.0  # a time slice preempts a hinted request once it runs past hint x this


class Scheduler:
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
        self.lanes = Lanes(k, cfg.mlfq_levels if self.pol.feedback else 1, not self.pol.classes)
        self.expiry = Expiry([c.timeout_s for c in cfg.classes.classes], self.pol.timeouts)
        self.admission = Admission(cfg.tenants, cfg.default_tenant, cfg.classes.names)
        self.service = ServiceStats(k, cfg.default_service_s)
        self.arrivals = ArrivalRates(k)
        self.counters = Counters(k)
        self.slots = sum(w.spec.slots for w in self.workers.values())
        self._free = self.slots
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
        self._k = k
        self._max_queued = [c.max_queued for c in cfg.classes.classes]
        self._max_queued_total = cfg.max_queued_total
        self._rights = [c for c in range(k) if cfg.classes[c].may_preempt]
        self._weights = [c.weight for c in cfg.classes.classes]
        self._rights_of = [c.may_preempt for c in cfg.classes.classes]
        # aging never lifts a request to a rank whose class may preempt it: it
        # would be dispatched only to be preempted at once
        self._ceilings = [
            max([cfg.aging_ceiling] + [r + 1 for r in range(k) if c in cfg.classes[r].may_preempt])
            for c in range(k)
        ]
        table = cfg.classes.classes
        # the preemptible classes each class may preempt
        self._victims = [tuple(sorted(v for v in c.may_preempt if table[v].preemptible)) for c in table]
        self._preempting = self.pol.preemption != "none"
        self._feedback_on = self.pol.feedback
        self._interval = cfg.aging_interval_s if self.pol.aging else None
        # for estimates: the classes a new request of each class may preempt,
        # and those whose queued work dispatches before it
        self._est_rights: list[frozenset[int]] = []
        self._est_ahead: list[tuple[int, ...]] = []
        for c in range(k):
            if self.pol.preemption == "none" or self.lanes.single:
                self._est_rights.append(frozenset())
            else:
                self._est_rights.append(frozenset(v for v in table[c].may_preempt if table[v].preemptible))
            if self.lanes.single:
                self._est_ahead.append(tuple(range(k)))
            elif self.pol.shares:
                self._est_ahead.append(tuple(a for a in range(c + 1) if a == c or table[a].may_preempt))
            else:
                self._est_ahead.append(tuple(range(c + 1)))
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
        if req.id in self._reqs:
            raise LanewayError(f"request id {req.id!r} is already live")
        cls = req.priority
        if not 0 <= cls < self._k:
            raise LanewayError(f"request {req.id}: unknown class rank {cls}")
        req.seq = self._seq
        self._seq += 1
        req.cls = cls
        self.counters.submitted += 1
        if req.model is not None or self._check_every:
            why = self.placement.never(req)
            if why is not None:
                return self._refuse(req, "unplaceable", why, now=now)
        if req.tenant is not None:
            refused = self.admission.check(req.tenant, cls, now)
            if refused is not None:
                return self._refuse(req, *refused, now=now)
        bound = self._max_queued[cls]
        if bound is not None and self.lanes.class_count[cls] >= bound:
            name = self.classes[cls].name
            return self._refuse(req, "queue_full", f"the {name} queue is full ({bound})", now=now)
        total = self._max_queued_total
        if total is not None and self.lanes.total >= total:
            victim = self._shed_candidate(cls)
            if victim is None:
                return self._refuse(req, "overloaded", "the server is overloaded", now=now)
            self._shed(victim, now)
        if req.tenant is not None:
            self.admission.charge(req.tenant, cls, now)
        est = req.est_service_s
        if est is None:
            est = self.service.means[cls] if req.model is None else self.service.mean(cls, req.model)
        req.est_s = est
        if self._feedback_on and req.est_service_s is not None:
            req.level = self._start_level(req.est_service_s)
        self.arrivals.add(cls, est, now)
        req.state = _QUEUED  # NEW -> QUEUED, checked on entry
        self._reqs[req.id] = req
        req.enqueued_s = now
        self.lanes.push(req)
        self.expiry.add(req, now)
        if req.tenant is not None:
            self.admission.on_admit(req.tenant)
        if req.depends_on or self._awaited:
            self._inherit(req)
        return None

    def _start_level(self, est_s: float) -> int:
        """Multi-level feedback with a size hint: a request expected to run long
        starts at the level it would reach anyway (level ``l`` holds work up to
        ``slice x (2^(l+1) - 1)`` seconds of service)."""
        top = self.lanes.levels - 1
        level = 0
        while level < top and est_s > self.cfg.mlfq_slice_s * (2 ** (level + 1) - 1):
            level += 1
        return level

    def finished(self, request_id: str, now: float, *, failed: bool = False) -> None:
        """The worker ended the request (``failed=True`` if it errored)."""
        req = self._reqs.get(request_id)
        if req is None:
            raise UnknownRequest(f"unknown request {request_id!r}")
        if req.state is not _RUNNING and req.state is not _PREEMPTED:
            raise InvalidTransition(f"request {request_id} is {req.state.value}, not running")
        service = req.run_s + (now - req.started_s)
        if req.state is _PREEMPTED:  # it ended before the preemption took effect
            req.preemptions -= 1
            self.counters.preemptions[req.cls] -= 1
        self._release(req)
        req.state = _FAILED if failed else _FINISHED  # from RUNNING or PREEMPTED, checked above
        if failed:
            self.counters.failed[req.priority] += 1
        else:
            self.counters.completed[req.priority] += 1
            self.service.record(req.priority, req.model, service)
        self._end(req)

    def preempted(
        self,
        request_id: str,
        now: float,
        *,
        tokens_done: int | None = None,
        checkpoint_bytes: int | None = None,
    ) -> None:
        """The worker stopped a preempted request and its slot is free."""
        req = self.get(request_id)
        if req.state is not _PREEMPTED:
            raise InvalidTransition(f"request {request_id} is {req.state.value}, not preempted")
        ran = max(req.preempt_at_s - req.started_s, 0.0)
        req.run_s += ran
        costs = self.cfg.costs
        req.tokens_done = (
            tokens_done if tokens_done is not None else req.tokens_done + costs.generated_in(ran)
        )
        if checkpoint_bytes is None:
            held = costs.tokens_held(req.prompt_tokens, req.tokens_done)
            checkpoint_bytes = costs.checkpoint_bytes(held) if req.resume == "checkpoint" else 0
        req.checkpoint_bytes = checkpoint_bytes
        self._release(req)
        req.state = _QUEUED  # PREEMPTED -> QUEUED, checked above
        req.enqueued_s = now
        self.lanes.push(req)
        if req.tenant is not None:
            self.admission.on_requeue(req.tenant)

    def cancel(self, request_id: str, now: float) -> bool:
        """Cancel a live request wherever it is; ``False`` if it is not live."""
        req = self._reqs.get(request_id)
        if req is None:
            return False
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
        if now >= self.expiry.next_due:
            for req in self.expiry.due(now):
                self._expire(req, now, out)
        if self._drains:
            self._overdue_drains(now, out)
        if self._clearing:
            self._lapsed_clearings(now)
        if (self._free > 0 or self._planner is not None) and self.lanes.total:
            self._dispatch(now, out)
        if self._slices:
            self._feedback(now, out)
        if self._preempting and self.lanes.total:
            self._preempt(now, out)
        return out

    def next_wakeup(self) -> float:
        """Earliest time ``schedule`` has work to do without a new event (inf: none)."""
        expiry = self.expiry
        t = expiry.refresh() if expiry.stale else expiry.next_due
        for req in self._drains.values():
            t = min(t, req.claim_deadline_s)
        for until, drained in self._clearing.values():
            if drained:
                t = min(t, until)
        if self._planner is not None and self.lanes.total:
            t = min(t, self._gpu_wakeup())
        if self._slices:
            t = min(t, self._slices[0][0])
        return t

    def estimate_wait(
        self, cls: int, model: str | None, now: float, est_service_s: float | None = None
    ) -> float:
        """Expected seconds a new class-``cls`` request would wait to start
        (``est_service_s``: its size hint, which places it under feedback)."""
        if self._planner is not None and model is not None:
            return self._estimate_on_gpus(cls, model, now)
        lanes = self.lanes
        count = lanes.class_count
        means = self.service.means
        rights = self._est_rights[cls]
        ahead = 0
        work = 0.0
        for c in self._est_ahead[cls]:
            n = count[c]
            if not n:
                continue
            # hinted work where given, the measured mean for the rest
            queued_work = lanes.hint_work[c] + (n - lanes.hint_count[c]) * means[c]
            if c == cls and self.pol.feedback and est_service_s is not None:
                # only the class's queued work at its own level or shorter is ahead
                part = lanes.queued_up_to(c, self._start_level(est_service_s))
                ahead += part
                work += queued_work * part / n
            else:
                ahead += n
                work += queued_work
        available = self._free
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
                remaining += max(self._end_sum[v] - n * now, 0.0)
        urgent = 0.0
        if cls and not lanes.single:
            urgent = self.arrivals.rate_before(cls, now) / self.slots
        return wait_estimate(
            slots=self.slots,
            available=available,
            ahead=ahead,
            ahead_work_s=work,
            blocking=blocking,
            blocking_remaining_s=remaining,
            mean_service_s=means[cls] if model is None else self.service.mean(cls, model),
            urgent_load=urgent,
        )

    def _estimate_on_gpus(self, cls: int, model: str, now: float) -> float:
        """The wait for ``model``'s replicas: its queue ahead over its slots, after
        the rest of a load when no replica of it is ready."""
        assert self._planner is not None
        spec = self._planner.inv.models.get(model)
        if spec is None:
            return 0.0
        reps = self._planner.by_model.get(model, [])
        ready = [r for r in reps if r.ready]
        cold = 0.0
        if not ready:
            loading = [r.ready_at for r in reps if not r.ready]
            cold = max(min(loading) - now, 0.0) if loading else spec.load_s
        slots = sum(r.model.slots for r in ready) or spec.slots
        running = sum(len(r.worker.running) for r in ready)
        free = sum(r.worker.free for r in ready if not r.draining)
        lanes = self.lanes
        m = lanes.models.get(model)
        ahead = 0
        if m is not None:
            base = m * lanes.width
            ahead = sum(lanes.count[base : base + (cls + 1) * lanes.levels])
        mean = self.service.mean(cls, model)
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

    def snapshot(self) -> Snapshot:
        names = self.classes.names
        c = self.counters
        return Snapshot(
            queue_depth={n: self.lanes.class_count[i] for i, n in enumerate(names)},
            running={n: len(self._running[i]) for i, n in enumerate(names)},
            slots_total=self.slots,
            slots_free=self._free,
            submitted=c.submitted,
            dispatched=c.dispatched,
            drains=c.drains,
            completed=dict(zip(names, c.completed, strict=True)),
            preemptions=dict(zip(names, c.preemptions, strict=True)),
            rejections=dict(c.rejections),
            model_loads=c.model_loads,
            **(self._planner.gauges() if self._planner is not None else {}),
        )

    # ------------------------------------------------------------------ admission helpers
    def _refuse(self, req: Request, reason: str, message: str, retry_s: float = 0.0, *, now: float) -> Reject:
        transition(req, State.REJECTED)
        self.counters.rejections[reason] += 1
        est = (
            0.0
            if reason in ("not_entitled", "unplaceable")
            else self.estimate_wait(req.priority, req.model, now)
        )
        return Reject(req.id, reason, message, est, max(retry_s, est if reason != "rate_limited" else 0.0))

    def _shed_candidate(self, cls: int) -> Request | None:
        """The newest never-started request of the least urgent class below ``cls``
        (by effective class: a request others depend on is spared)."""
        for c in range(len(self.classes) - 1, cls, -1):
            victim = self.expiry.newest(c, above=cls)
            if victim is not None:
                return victim
        return None

    def _shed(self, req: Request, now: float) -> None:
        self._dequeue(req, now)
        transition(req, State.REJECTED)
        self.counters.rejections["shed"] += 1
        est = self.estimate_wait(req.priority, req.model, now)
        self._pending.append(
            Reject(req.id, "shed", "dropped under overload for more urgent work", est, max(est, 1.0))
        )
        self._end(req)

    def _expire(self, req: Request, now: float, out: list[Decision]) -> None:
        self._dequeue(req, now)
        transition(req, State.EXPIRED)
        self.counters.rejections["queue_timeout"] += 1
        self._end(req)
        est = self.estimate_wait(req.priority, req.model, now)
        name = self.classes[req.priority].name
        out.append(Reject(req.id, "queue_timeout", f"queued past the {name} timeout", est, max(est, 1.0)))

    # ------------------------------------------------------------------ state changes
    def _dequeue(self, req: Request, now: float) -> None:
        self.lanes.take(req)
        if req.deadline_s <= self.expiry.next_due:
            self.expiry.stale = True  # the earliest deadline may be gone with it
        req.queued_total_s += now - req.enqueued_s
        if req.tenant is not None:
            self.admission.on_dequeue(req.tenant)

    def _start(self, req: Request, w: WorkerState, now: float, out: list[Decision]) -> None:
        self.lanes.take(req)
        if req.deadline_s <= self.expiry.next_due:
            self.expiry.stale = True  # the earliest deadline may be gone with it
        req.queued_total_s += now - req.enqueued_s
        if req.tenant is not None:
            self.admission.on_dequeue(req.tenant)
        req.state = _RUNNING  # QUEUED -> RUNNING: only queued requests are selected
        if req.first_start_s != req.first_start_s:  # NaN: never started
            req.first_start_s = now
        else:
            self.counters.resumed += 1
        req.started_s = now
        self._changes += 1
        rid = req.id
        cls = req.cls
        req.expected_end_s = end = now + max(req.est_s - req.run_s, 0.0)
        req.worker = w.id
        w.running[rid] = req
        w.free -= 1
        self._free -= 1
        self.placement.slot_taken(w)
        if self._planner is not None:
            self._planner.touch(w.id, now)
        self._running[cls][rid] = req
        self._end_sum[cls] += end
        self.counters.dispatched += 1
        out.append(Dispatch(rid, w.id, req.resume))
        if self._feedback_on and self.classes.classes[cls].preemptible:
            slice_s = self.cfg.mlfq_slice_s * (2**req.level)
            heapq.heappush(self._slices, (now + slice_s, req.seq, now, req))

    def _release(self, req: Request) -> None:
        """Free the slot held by a running or preempted request."""
        w = self.workers[req.worker]  # type: ignore[index]
        rid = req.id
        self._changes += 1
        del w.running[rid]
        w.free += 1
        self._free += 1
        self.placement.slot_freed(w)
        del self._running[req.cls][rid]
        self._end_sum[req.cls] -= req.expected_end_s
        req.worker = None
        c = req.claimed_for
        if c is not None:
            self._incoming[c] -= 1
            self._reserved[c] += 1
            self._reserved_total += 1
            req.claimed_for = None
            self._drains.pop(rid, None)

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

    # ------------------------------------------------------------------ priority inheritance
    def _inherit(self, req: Request) -> None:
        """Link ``req`` to what it depends on, and to what already waits for it."""
        for dep_id in req.depends_on:
            dep = self._reqs.get(dep_id)
            if dep is None:  # not submitted yet (or already ended): remember the wait
                self._awaited.setdefault(dep_id, set()).add(req.id)
                continue
            if dep.waiters is None:
                dep.waiters = set()
            dep.waiters.add(req.id)
            self._reclass(dep, set())
        waiters = self._awaited.pop(req.id, None)
        if waiters:
            req.waiters = (req.waiters or set()) | waiters
            self._reclass(req, set())

    def _reclass(self, req: Request, seen: set[str]) -> None:
        """Set ``req``'s effective class from its own and its live waiters'."""
        if req.id in seen:
            return
        seen.add(req.id)
        target = req.priority
        for wid in req.waiters or ():
            waiter = self._reqs.get(wid)
            if waiter is not None and waiter.cls < target:
                target = waiter.cls
        req.inherited = target if target != req.priority else None
        if target != req.cls:
            self._changes += 1  # preemptibility may change: victim searches look again
            c = req.claimed_for
            if c is not None and req.state is _RUNNING and target not in self._victims[c]:
                # a drain claim on it lapses: its claimant may not preempt it any more
                req.claimed_for = None
                self._incoming[c] -= 1
                self._drains.pop(req.id, None)
            if req.state is _QUEUED:
                self.lanes.take(req)
                req.cls = target
                self.lanes.push(req)
            else:
                run = self._running[req.cls].pop(req.id)
                self._end_sum[req.cls] -= req.expected_end_s
                req.cls = target
                self._running[target][req.id] = run
                self._end_sum[target] += req.expected_end_s
            for dep_id in req.depends_on:
                dep = self._reqs.get(dep_id)
                if dep is not None:
                    self._reclass(dep, seen)

    # ------------------------------------------------------------------ dispatch
    def _dispatch(self, now: float, out: list[Decision]) -> None:
        blocked: set[int] = _NONE_BLOCKED
        lanes = self.lanes
        planner = self._planner
        while (self._free > 0 or planner is not None) and lanes.total:
            req = self._reserved_head(now, blocked) if self._reserved_total else None
            if req is None:
                req = self._select(now, blocked)
                if req is None:
                    return
            w = self.placement.place(req, now) if self._free > 0 else None
            if w is None:
                if planner is not None:
                    self._plan_load(req, now, out)
                if blocked is _NONE_BLOCKED:
                    blocked = set()
                blocked.add(req.lane)
                continue
            self._start(req, w, now, out)

    # ------------------------------------------------------------------ model loads
    def _plan_load(self, req: Request, now: float, out: list[Decision]) -> None:
        """Ask the GPU placement for loads (and evictions) that would serve ``req``."""
        assert self._planner is not None
        for d in self._planner.plan(req, now, self.lanes.model_queued, now - req.arrival_s):
            if type(d) is Evict:
                w = self.workers.pop(d.replica_id)
                self._free -= w.free
                self.slots -= w.spec.slots
                self._changes += 1
            else:
                self.counters.model_loads += 1
            out.append(d)

    def _gpu_wakeup(self) -> float:
        """When placement may answer differently with nobody acting: an idle
        replica becomes evictable (idle for its load time), a drain lapses, a
        waiting request reaches the switch bound."""
        assert self._planner is not None
        now = self._now
        t = math.inf
        for r in self._planner.replicas.values():
            if r.draining > now:
                t = min(t, r.draining)
            if r.idle:
                evictable_at = r.last_used + r.model.load_s
                if evictable_at > now:
                    t = min(t, evictable_at)
        switch = self._planner.switch_wait_s
        lanes = self.lanes
        for lane, n in enumerate(lanes.count):
            if n:
                head = lanes.head(lane)
                if head is not None and head.arrival_s + switch > now:
                    t = min(t, head.arrival_s + switch)
        return t

    def loaded(self, replica_id: str, now: float) -> None:
        """The runtime finished loading a replica: its slots take work from now on."""
        if self._planner is None:
            raise LanewayError("this scheduler's placement does not load models")
        w = self._planner.loaded(replica_id, now)
        self.workers[w.id] = w
        self._free += w.free
        self.slots += w.spec.slots
        self._changes += 1

    def _reserved_head(self, now: float, blocked: set[int]) -> Request | None:
        """The request a freed, reserved slot goes to: the class it was freed for,
        unless a request of a more urgent class arrived meanwhile (the class
        that lost the slot claims another one in the same step)."""
        best = self._select(now, blocked)
        for c, n in enumerate(self._reserved):
            if n:
                req = best if best is not None and best.cls < c else self._best_in_class(c, now, blocked)
                if req is None:
                    self._reserved_total -= n
                    self._reserved[c] = 0  # nobody of that class is waiting any more
                    continue
                self._reserved[c] -= 1
                self._reserved_total -= 1
                return req
        return None

    def _select(self, now: float, blocked: set[int]) -> Request | None:
        if self.pol.shares:
            running = [len(r) for r in self._running]
            return select_share(
                self.lanes, running, self._weights, self._rights_of, now, blocked, self._boost
            )
        return select_strict(self.lanes, now, blocked, self._interval, self._ceilings)

    def _best_in_class(self, cls: int, now: float, blocked: set[int]) -> Request | None:
        return best_in_class(self.lanes, cls, now, blocked, self._boost)

    # ------------------------------------------------------------------ preemption
    def _preemptible(self, req: Request) -> bool:
        return (
            req.state is _RUNNING
            and req.claimed_for is None
            and req.preemptible
            and self.classes[req.cls].preemptible
            and req.preemptions < self.cfg.max_preemptions
        )

    def _candidates(
        self, victims: tuple[int, ...], model: str | None, now: float, cls: int | None = None
    ) -> list[Candidate]:
        return gather_candidates(
            self._running, victims, self.workers, model, now, self.cfg.costs, self.cfg.max_preemptions, cls
        )

    def _preempt(self, now: float, out: list[Decision]) -> None:
        count = self.lanes.class_count
        running = self._running
        for c in self._rights:
            need = count[c] - self._incoming[c] - self._reserved[c]
            if need <= 0:
                continue
            for v in self._victims[c]:
                if running[v]:
                    break
            else:
                continue  # nothing it may preempt is running
            if self._barren[c] == self._changes:
                continue  # searched in vain and no slot changed hands since
            mode = self.pol.preemption
            cap = self.cfg.drain_cap_s
            model = None
            head: Request | None = None
            if len(self.lanes.models) > 1:  # requests name models: victims must serve it
                head = self._best_in_class(c, now, _NONE_BLOCKED)
                model = head.model if head is not None else None
            while need > 0:
                action = choose_action(self._candidates(self._victims[c], model, now, c), mode, cap)
                if action is None:
                    if self._planner is not None and self._room_for(c, now, out):
                        need -= 1
                        continue
                    self._barren[c] = self._changes
                    break
                victim = self._reqs[action.victim.request_id]
                victim.claimed_for = c
                self._incoming[c] += 1
                if action.kind == "drain":
                    wait = cap if mode == "drain" else action.victim.eta_s + action.victim.lost_s
                    # stop draining in time for the waiting request to start before it expires
                    if head is None:
                        head = self._best_in_class(c, now, _NONE_BLOCKED)
                    latest = head.deadline_s - action.victim.lost_s if head is not None else math.inf
                    victim.claim_deadline_s = max(now, min(now + wait, latest))
                    self._drains[victim.id] = victim
                    self.counters.drains += 1
                else:
                    self._stop(victim, action.mode, c, now, out)
                need -= 1

    def _lapsed_clearings(self, now: float) -> None:
        """A graceful clearing whose window passed: search again (and preempt)."""
        for model, (until, drained) in list(self._clearing.items()):
            if until <= now:
                if drained:
                    self._clearing[model] = (now, True)  # ended draining: preempt next time
                    self._changes += 1
                else:
                    del self._clearing[model]

    def _room_for(self, c: int, now: float, out: list[Decision]) -> bool:
        """GPU fleets: the head of class ``c`` fits nowhere and nothing it may
        preempt runs its model: clear replicas of other models to load it."""
        assert self._planner is not None
        head = self._best_in_class(c, now, _NONE_BLOCKED)
        if head is None or head.model is None:
            return False
        until, drained = self._clearing.get(head.model, (0.0, False))
        if until > now:
            return False  # clearing for it already
        victims_of = self._victims[c]
        victims = self._planner.make_room(head, now, lambda r: r.cls in victims_of and self._preemptible(r))
        if victims is None:
            return False
        load_s = self._planner.inv.models[head.model].load_s
        if self.pol.preemption == "drain" and not drained:
            # graceful: let the victims end if they do so within the drain cap and
            # in time for the load to finish before the request's queue timeout
            window = min(self.cfg.drain_cap_s, head.deadline_s - now - load_s - 1.0)
            if window > 0 and all(
                max(v.est_s - v.run_s - (now - v.started_s), 0.0) <= window for v in victims
            ):
                self._clearing[head.model] = (now + window, True)
                return True
        self._clearing[head.model] = (now + self._planner.switch_wait_s, False)
        for v in victims:
            self._stop(v, self._cheapest_mode(v, now), c, now, out)
        return True

    def _stop(self, victim: Request, mode: str, for_class: int, now: float, out: list[Decision]) -> None:
        transition(victim, _PREEMPTED)
        victim.preempt_at_s = now
        victim.preemptions += 1
        victim.resume = mode
        self._drains.pop(victim.id, None)
        self.counters.preemptions[victim.cls] += 1
        out.append(Preempt(victim.id, victim.worker, mode, for_class))  # type: ignore[arg-type]

    def _cheapest_mode(self, req: Request, now: float) -> str:
        costs = self.cfg.costs
        held = costs.tokens_held(req.prompt_tokens, req.tokens_done + costs.generated_in(now - req.started_s))
        can = self.workers[req.worker].spec.can_checkpoint  # type: ignore[index]
        if self.pol.preemption == "recompute" or not can:
            return "recompute"
        if self.pol.preemption == "checkpoint":
            return "checkpoint"
        return "checkpoint" if costs.checkpoint_cost_s(held) <= costs.recompute_cost_s(held) else "recompute"

    def _overran(self, req: Request, now: float) -> bool:
        """Time slices preempt work the scheduler knew nothing about, or work that
        ran well past its size hint; a request whose hint placed it at its level
        in the first place is left to finish."""
        hint = req.est_service_s
        return hint is None or req.run_s + (now - req.started_s) > OVERRUN * hint

    def _overdue_drains(self, now: float, out: list[Decision]) -> None:
        """A drained victim that has not ended by its deadline is preempted, if
        its claimant class still needs the slot; otherwise the claim lapses."""
        count = self.lanes.class_count
        for req in [r for r in self._drains.values() if r.claim_deadline_s <= now]:
            c: int = req.claimed_for  # type: ignore[assignment]
            if count[c] - self._incoming[c] - self._reserved[c] < 0:
                req.claimed_for = None
                self._incoming[c] -= 1
                del self._drains[req.id]
                self._changes += 1  # it may be a victim for someone else now
                continue
            self._stop(req, self._cheapest_mode(req, now), c, now, out)

    def _feedback(self, now: float, out: list[Decision]) -> None:
        """Multi-level feedback: a request past its time slice drops a level and
        yields its slot if shorter work of its class is waiting."""
        heap = self._slices
        lanes = self.lanes
        top = lanes.levels - 1
        while heap and heap[0][0] <= now:
            _, _, started, req = heapq.heappop(heap)
            if req.state is not _RUNNING or req.started_s != started:
                continue
            if req.level < top:
                req.level += 1
            waiting = lanes.waiting_below(req.cls, req.level)
            if waiting and self._free == 0 and self._overran(req, now) and self._preemptible(req):
                req.claimed_for = req.cls
                self._incoming[req.cls] += 1
                self._stop(req, self._cheapest_mode(req, now), req.cls, now, out)
            else:
                slice_s = self.cfg.mlfq_slice_s * (2**req.level)
                heapq.heappush(heap, (now + slice_s, req.seq, started, req))

    # ------------------------------------------------------------------ invariants
    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if the internal state is inconsistent."""
        if self._planner is not None:
            self._planner.check()
            ready = {rid for rid, r in self._planner.replicas.items() if r.ready}
            assert ready == set(self.workers), "ready replicas and workers differ"
        assert self.slots == sum(w.spec.slots for w in self.workers.values())
        k = len(self.classes)
        queued = [0] * k
        incoming = [0] * k
        on_workers: dict[str, str] = {}
        for w in self.workers.values():
            assert 0 <= w.free == w.spec.slots - len(w.running), f"worker {w.id} slot count"
            for rid, r in w.running.items():
                assert rid not in on_workers, f"{rid} on two workers"
                on_workers[rid] = w.id
                assert r.state in (_RUNNING, _PREEMPTED), f"{rid} on a worker while {r.state}"
        assert self._free == sum(w.free for w in self.workers.values())
        for rid, r in self._reqs.items():
            assert r.state in (_QUEUED, _RUNNING, _PREEMPTED), f"{rid} live while {r.state}"
            if r.state is _QUEUED:
                queued[r.cls] += 1
                assert rid not in on_workers, f"{rid} both queued and running"
            else:
                assert on_workers.get(rid) == r.worker, f"{rid} not on its worker"
                assert rid in self._running[r.cls]
            if r.claimed_for is not None:
                incoming[r.claimed_for] += 1
        assert len(on_workers) == sum(len(d) for d in self._running)
        assert queued == self.lanes.class_count, (queued, self.lanes.class_count)
        assert incoming == self._incoming, (incoming, self._incoming)
