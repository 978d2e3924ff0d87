"""The scheduler: events in, decisions out.

Drive it with a clock value on every call:

- :meth:`Scheduler.submit` admits a request (or returns a :class:`Reject`);
- :meth:`Scheduler.finished`, :meth:`Scheduler.preempted` and
  :meth:`Scheduler.cancel` report what happened on the workers;
- :meth:`Scheduler.schedule` returns the decisions to apply now
  (:class:`Dispatch`, :class:`Preempt`, :class:`Reject`, :class:`Load`, :class:`Evict`);
- :meth:`Scheduler.next_wakeup` says when to call ``schedule`` again if
  nothing else happens (timeouts, drain limits, time slices).

No I/O, no threads, no clock of its own: the simulator and the server drive
the same object.

The scheduler holds its state in parts that each own their data —
:class:`~laneway.core.tables.Tables` (what the configuration fixes, frozen),
:class:`~laneway.core.live.Live` (the live requests),
:class:`~laneway.core.lanes.Lanes` (the queues, with their deadlines),
:class:`~laneway.core.occupancy.Occupancy` (who runs where, free and held slots),
:class:`~laneway.core.promises.Promises` (what preemption promised),
:class:`~laneway.core.measures.Measures` (what was measured) — and runs its steps as
components handed what they need: :class:`~laneway.core.lifecycle.Lifecycle` (a
request's events, admitted to ended), :class:`~laneway.core.refusal.Refusals`,
:class:`~laneway.core.dispatching.Dispatcher`,
:class:`~laneway.core.preemption.Preemptor`, :class:`~laneway.core.feedback.TimeSlices`,
:class:`~laneway.core.inheritance.Inheritance`, :class:`~laneway.core.loads.ModelLoads`;
:class:`~laneway.core.estimator.Estimator` reads it all and writes nothing.
:func:`~laneway.core.assembly.assemble` builds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from laneway.core.assembly import assemble
from laneway.core.config import SchedulerConfig
from laneway.core.costs import CostModel
from laneway.core.decisions import Decision, Reject
from laneway.core.errors import LanewayError
from laneway.core.expiry import Expiry
from laneway.core.gpu_placement import GpuPlacement
from laneway.core.inspection import check_invariants, snapshot
from laneway.core.lifecycle import Lifecycle
from laneway.core.loads import ModelLoads
from laneway.core.measures import (
    ArrivalRates,
    Calibration,
    ServiceStats,
    SizeSpread,
    WaitRange,
)
from laneway.core.placement import Placement, SlotPlacement
from laneway.core.policies import PolicySpec, policy
from laneway.core.prefix_cache import PrefixIndex
from laneway.core.request import Request
from laneway.core.stats import Snapshot
from laneway.core.workers import WorkerSpec, WorkerState


class Scheduler:
    __slots__ = (
        "_calibration",
        "_expiry",
        "_exposed_running",
        "_now",
        "_preempting",
        "admission",
        "cfg",
        "classes",
        "counters",
        "dispatcher",
        "estimator",
        "fair",
        "holds",
        "inheritance",
        "isolation",
        "lanes",
        "lifecycle",
        "live_requests",
        "loads",
        "measures",
        "occupancy",
        "pol",
        "preemptor",
        "promises",
        "refusals",
        "slices",
        "tables",
    )

    def __init__(
        self,
        workers: Sequence[WorkerSpec],
        config: SchedulerConfig | None = None,
        policy_name: str | PolicySpec = "laneway",
        placement: Placement | None = None,
    ) -> None:
        self.cfg = cfg = config or SchedulerConfig()
        self.pol = pol = policy(policy_name)
        self.classes = cfg.classes
        parts = assemble(workers, cfg, pol, placement)
        self.tables = parts.tables
        self.occupancy = occ = parts.occupancy
        self.lanes = parts.lanes
        self.promises = parts.promises
        self.measures = measures = parts.measures
        self.counters = parts.counters
        self.admission = parts.admission
        self.live_requests = parts.live_requests
        self.inheritance = parts.inheritance
        self.fair = parts.fair
        self.isolation = parts.isolation
        self.loads = parts.loads
        self.estimator = parts.estimator
        self.refusals = parts.refusals
        self.preemptor = parts.preemptor
        self.slices = parts.slices
        self.holds = parts.holds
        self.dispatcher = parts.dispatcher
        self.lifecycle = Lifecycle(parts)  # (a request's events: admitted to ended)
        self._now = 0.0  # the clock of the last schedule() call
        # (the parts' own objects, held here too for the hot path)
        self._calibration = measures.calibration
        self._expiry = parts.expiry
        self._preempting = parts.tables.preempting
        self._exposed_running = occ.exposed_running  # (the running requests some class may preempt)

    # ------------------------------------------------------------------ queries
    def get(self, request_id: str) -> Request:
        return self.live_requests.get(request_id)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.live_requests.reqs

    @property
    def live(self) -> int:
        return len(self.live_requests.reqs)

    @property
    def queued(self) -> int:
        return self.lanes.total

    @property
    def free_slots(self) -> int:
        return self.occupancy.free

    @property
    def slots(self) -> int:
        return self.occupancy.slots

    @property
    def workers(self) -> dict[str, WorkerState]:
        return self.occupancy.workers

    @property
    def placement(self) -> Placement:
        return self.occupancy.placement

    @property
    def planner(self) -> GpuPlacement | None:
        """The GPU placement, where this scheduler loads models (else ``None``)."""
        return self.loads.planner if self.loads is not None else None

    @property
    def expiry(self) -> Expiry:
        return self._expiry

    @property
    def costs(self) -> CostModel:
        return self.measures.costs

    @property
    def service(self) -> ServiceStats:
        return self.measures.service

    @property
    def arrivals(self) -> ArrivalRates:
        return self.measures.arrivals

    @property
    def calibration(self) -> Calibration:
        return self.measures.calibration

    @property
    def spread(self) -> SizeSpread:
        return self.measures.spread

    def use_costs(self, costs: CostModel) -> None:
        """Schedule by ``costs`` (measured on the engines before the first request)."""
        self.cfg = replace(self.cfg, costs=costs)
        self.measures.costs = costs

    def snapshot(self) -> Snapshot:
        return snapshot(self)

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if the internal state is inconsistent."""
        check_invariants(self)

    # ------------------------------------------------------------------ arrivals and ends
    def submit(self, req: Request, now: float) -> Reject | None:
        """Admit ``req`` into its class queue, or refuse it."""
        return self.lifecycle.submit(req, now)

    def finished(
        self,
        request_id: str,
        now: float,
        *,
        failed: bool = False,
        tokens: int | None = None,
        prompt_tokens: int | None = None,
    ) -> None:
        """The worker ended the request (:meth:`Lifecycle.finished
        <laneway.core.lifecycle.Lifecycle.finished>`). One its engine refused (``failed``,
        ``prompt_tokens=0``: an upstream's 400) left nothing in its prefix cache: the blocks
        placement recorded for it there that were not held before are dropped (refused
        prompts pushed the prompts in use out of the index)."""
        if failed and prompt_tokens == 0:
            self._refused(request_id)
        self.lifecycle.finished(request_id, now, failed=failed, tokens=tokens, prompt_tokens=prompt_tokens)

    def preempted(
        self,
        request_id: str,
        now: float,
        *,
        tokens_done: int | None = None,
        checkpoint_bytes: int | None = None,
        save_s: float | None = None,
    ) -> None:
        """The worker stopped a preempted request and its slot is free (:meth:`Lifecycle.preempted
        <laneway.core.lifecycle.Lifecycle.preempted>`)."""
        self.lifecycle.preempted(
            request_id, now, tokens_done=tokens_done, checkpoint_bytes=checkpoint_bytes, save_s=save_s
        )

    def cancel(self, request_id: str, now: float, *, tokens: int | None = None) -> bool:
        """Cancel a live request wherever it is (:meth:`Lifecycle.cancel
        <laneway.core.lifecycle.Lifecycle.cancel>`); ``False`` if it is not live."""
        return self.lifecycle.cancel(request_id, now, tokens=tokens)

    def withdraw(
        self, request_id: str, now: float, reason: str, message: str, retry_after_s: float
    ) -> Reject:
        """Refuse a queued request now (the runtime knows it cannot run: no worker for its
        model is healthy). Its wait estimate is ``retry_after_s``: it cannot start sooner."""
        return self.refusals.withdraw(request_id, now, reason, message, retry_after_s)

    def progress(self, request_id: str, tokens: int, now: float) -> None:
        """A running request has made ``tokens`` output tokens so far (:meth:`Lifecycle.progress
        <laneway.core.lifecycle.Lifecycle.progress>`)."""
        self.lifecycle.progress(request_id, tokens, now)

    def first_token(self, request_id: str, now: float) -> bool:
        """A running request made its first output token: its prompt is prefilled. Whether
        a scheduling step is due (:meth:`Lifecycle.first_token
        <laneway.core.lifecycle.Lifecycle.first_token>`)."""
        return self.lifecycle.first_token(request_id, now)

    def quota_refusal(self, tenant: str | None, cls: int, now: float) -> tuple[str, str, float] | None:
        """Whether a new class-``cls`` request of ``tenant`` would be refused by its
        entitlements or quotas now: ``(reason, message, retry_after_s)``, or ``None``.
        It charges nothing."""
        return None if tenant is None else self.admission.check(tenant, cls, now)

    # ------------------------------------------------------------------ workers
    def requeue(self, request_id: str, now: float, *, failed: bool = False) -> None:
        """Its run stopped before the request produced anything (``failed``: its worker
        failed): queue it again (:meth:`Lifecycle.requeue
        <laneway.core.lifecycle.Lifecycle.requeue>`)."""
        self.lifecycle.requeue(request_id, now, failed=failed)

    def available_for(self, model: str | None) -> bool:
        """Whether some worker that serves ``model`` is in placement (not taken out)."""
        return self.estimator.available_for(model)

    def set_available(self, worker_id: str, available: bool) -> None:
        """Take a worker out of placement (it is failing) or back in (it recovered).

        Requests it runs are not touched; queued ones wait for other workers
        (an unavailable worker is "not now", never "never").
        """
        w = self.occupancy.workers.get(worker_id)
        if w is None:
            raise LanewayError(f"unknown worker {worker_id!r}")
        self.occupancy.placement.set_available(w, available)

    def set_slots(self, worker_id: str, n: int) -> None:
        """``worker_id`` may run ``n`` requests at once (1 to its slots): an engine's
        concurrency adapted to what it can take. Lowering it stops nothing: running
        requests end as they would, and their slots stay withheld."""
        self.occupancy.set_slots(worker_id, n)

    def set_kv_tokens(self, worker_id: str, tokens: int) -> None:
        """The engine of ``worker_id`` holds ``tokens`` of KV cache: the most of its prompts'
        blocks placement expects it to keep (placement ``prefix``; otherwise nothing)."""
        index = self._prefix_index(worker_id)
        if index is not None:
            index.set_capacity(worker_id, tokens)

    def cache_lost(self, worker_id: str) -> None:
        """The engine of ``worker_id`` holds none of its prefix cache any more (it restarted,
        or another engine answers there): placement expects no hit on it until it is sent
        prompts again (placement ``prefix``; otherwise nothing)."""
        index = self._prefix_index(worker_id)
        if index is not None:
            index.forget(worker_id)

    def cached_on(self, worker_id: str, prefix: tuple[int, ...]) -> None:
        """A prompt of blocks ``prefix`` started on ``worker_id`` outside this scheduler (on a
        slot it lent): its engine likely holds them now (placement ``prefix``)."""
        index = self._prefix_index(worker_id)
        if index is not None:
            index.record(worker_id, prefix)

    def _refused(self, request_id: str) -> None:
        req = self.live_requests.reqs.get(request_id)
        if req is None or not req.prefix or req.prefilled or req.worker is None:
            return
        index = self._prefix_index(req.worker)
        if index is not None and req.worker in index:
            index.drop(req.worker, req.prefix[req.cached_blocks :])

    def _prefix_index(self, worker_id: str) -> PrefixIndex | None:
        if worker_id not in self.occupancy.workers:
            raise LanewayError(f"unknown worker {worker_id!r}")
        placement = self.occupancy.placement
        return placement.index if isinstance(placement, SlotPlacement) else None

    def adopt(self, req: Request, worker_id: str, now: float) -> None:
        """Take in ``req`` as running on ``worker_id`` already (:meth:`Lifecycle.adopt
        <laneway.core.lifecycle.Lifecycle.adopt>`)."""
        self.lifecycle.adopt(req, worker_id, now)

    def hold(self, worker_id: str, n: int) -> None:
        """Hold ``n`` slots of ``worker_id`` (in all, not more) out of this scheduler's
        hands: in use elsewhere, e.g. lent to a replica of a cluster that starts requests
        on them itself. Held slots are neither free nor running; holding more takes free
        ones only. Estimates count them as available (whoever holds them gives them back
        when asked)."""
        self.occupancy.hold(worker_id, n)

    def _fleet(self) -> ModelLoads:
        if self.loads is None:
            raise LanewayError("this scheduler's placement does not load models")
        return self.loads

    def loaded(self, replica_id: str, now: float) -> None:
        """The runtime finished loading a replica: its slots take work from now on."""
        self._fleet().loaded(replica_id, now)

    def adopt_replica(self, replica_id: str, model: str, gpus: tuple[str, ...], now: float) -> None:
        """A replica whose engine already runs and serves ``model`` on ``gpus`` (placed by a
        scheduler before this one: a cluster's earlier leader) takes work from now on."""
        self._fleet().adopt(replica_id, model, gpus, now)

    def set_offline(self, nodes: set[str]) -> None:
        """Nothing is loaded on ``nodes`` from now on (what runs there stays until told)."""
        self._fleet().planner.vram.offline = set(nodes)

    def unloaded(self, replica_id: str, now: float) -> None:
        """Replica ``replica_id`` is gone without an ``Evict`` (its load failed, or its
        engine died after its requests were ended or queued again): its GPUs' VRAM is free
        and a later request may load its model again."""
        self._fleet().unloaded(replica_id)

    def adapter_failed(self, replica_id: str, adapter: str, now: float) -> None:
        """LoRA ``adapter`` could not be loaded into replica ``replica_id`` (a ``LoadAdapter``
        failed): it is not held there; a later request of it loads it again."""
        self._fleet().planner.adapter_gone(replica_id, adapter)

    def reload(self, model: str, now: float) -> list[Decision]:
        """Decisions that load preloaded ``model`` again with no request waiting for it (its
        start failed or its engine died: the runtime retries after a back-off), into free
        VRAM only; [] if a replica of it is loading or ready, or none fits now."""
        return self._fleet().reload(model, now)

    def load_took(self, model: str, seconds: float, *, wake: bool = False) -> None:
        """A load (``wake``: a wake from sleep) of ``model`` was measured to take ``seconds``:
        it replaces the configured ``load_s`` (``wake_s``) in later decisions (which loads
        are worth it, wait estimates)."""
        self._fleet().planner.load_took(model, seconds, wake=wake)

    # ------------------------------------------------------------------ decide
    def schedule(self, now: float) -> list[Decision]:
        """Decisions to apply now, in order."""
        self._now = now
        refusals = self.refusals
        out = refusals.pending
        refusals.pending = []
        watching = self._calibration.watching
        if watching and now > watching[0][0]:
            self._calibration.overdue(now)
        if now >= self._expiry.next_due:
            refusals.expire(now, out)
        promises = self.promises
        if promises.drains:
            self.preemptor.overdue_drains(now, out)
        if promises.clearing:
            self.preemptor.lapsed_clearings(now)
        self.dispatcher.step(now, out)
        isolation = self.isolation
        if isolation is not None:
            if isolation.started:
                isolation.separate(self.preemptor, now, out)
            if isolation.stops:  # (what it keeps off, for the estimates: only where it stops work)
                isolation.observe(now)
        guard = self.dispatcher.guard
        if guard is not None and guard.started:
            guard.separate(self.preemptor, self.occupancy.workers, now, out)
        if self.slices.heap:
            self.slices.step(now, out)
        if self._preempting and self.lanes.total:
            for running in self._exposed_running:
                if running:  # some running work may be preempted: look for waiting claimants
                    self.preemptor.step(now, out)
                    break
        return out

    def next_wakeup(self) -> float:
        """Earliest time ``schedule`` has work to do without a new event (inf: none)."""
        expiry = self._expiry
        t = expiry.refresh() if expiry.stale else expiry.next_due
        promises = self.promises
        for req in promises.drains.values():
            t = min(t, req.claim_deadline_s)
        for until, drained in promises.clearing.values():
            if drained and until > self._now:  # a drain window still open
                t = min(t, until)
        if self.loads is not None and self.lanes.total:
            t = min(t, self.loads.wakeup(self._now))
        if self.slices.heap:
            t = min(t, self.slices.next_due())
        if self.holds.count and self.lanes.total:
            t = min(t, self.holds.next_lapse())
        if self.isolation is not None and self.lanes.total:
            t = min(t, self.isolation.next_calm(self._now))
        affinity = self.dispatcher.affinity
        if affinity is not None and affinity.stopped and self.lanes.total:
            t = min(t, affinity.next_due(self._now))
        return t

    # ------------------------------------------------------------------ estimates
    def estimate_wait(
        self,
        cls: int,
        model: str | None,
        now: float,
        est_service_s: float | None = None,
        *,
        raw: bool = False,
    ) -> float:
        """:meth:`Estimator.estimate_wait <laneway.core.estimator.Estimator.estimate_wait>`."""
        self._check_rank(cls)
        return self.estimator.estimate_wait(cls, model, now, est_service_s, raw=raw)

    def estimate_range(
        self, cls: int, model: str | None, now: float, est_service_s: float | None = None
    ) -> tuple[float, WaitRange]:
        """:meth:`Estimator.estimate_range <laneway.core.estimator.Estimator.estimate_range>`."""
        self._check_rank(cls)
        return self.estimator.estimate_range(cls, model, now, est_service_s)

    def _check_rank(self, cls: int) -> None:
        if not 0 <= cls < len(self.classes):
            raise LanewayError(f"unknown class rank {cls}: this scheduler's are 0–{len(self.classes) - 1}")
