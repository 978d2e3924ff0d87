"""The runtime: feeds events to the core scheduler and applies its decisions.

Everything runs on one asyncio loop, with the loop's monotonic clock as the
scheduler's clock. Events are arrivals (:meth:`Runtime.submit`), worker events
(``Delta``/``Done``/``Stopped``/``Failed``, see :mod:`laneway.runtime.events`),
client disconnects (:meth:`Runtime.cancel`) and timer ticks (the scheduler's
``next_wakeup`` and queue-wait alerts). After any of them one scheduling step
runs (coalesced: several events in one loop turn share a step) and its
decisions are carried out:

- ``Dispatch``: ``worker.run(job)``, or ``worker.resume(checkpoint)`` for a
  request preempted before (the text streamed so far is not sent again);
- ``Preempt``: ``worker.preempt(job, mode)``; its ``Stopped`` event reports
  ``scheduler.preempted`` and keeps the checkpoint for the resume;
- ``Reject``: the waiting handler gets the error (503/429/403/404).

A worker that fails a request with a retryable error before it streamed
anything is taken out of placement and the request runs elsewhere
(:mod:`laneway.runtime.recovery`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Coroutine, Mapping
from dataclasses import replace
from typing import Any

from laneway.backends.base import Worker
from laneway.backends.upstream_run import UpstreamUnavailable
from laneway.config.schema import ServerConfig
from laneway.core import (
    CostModel,
    Dispatch,
    Evict,
    Load,
    Preempt,
    Reject,
    Request,
    Scheduler,
    WaitRange,
)
from laneway.core.decisions import LoadAdapter, UnloadAdapter, apply
from laneway.core.policies import stoppable_classes
from laneway.errors import ClientGone, GenerationFailed, RequestError, Unavailable
from laneway.generation import Job, ResumeMethod
from laneway.logs import request_ended
from laneway.runtime.alerts import QueueWaitAlerts
from laneway.runtime.costs import measured_costs
from laneway.runtime.engine_watch import EngineWatch
from laneway.runtime.events import WorkerEvents
from laneway.runtime.fleet import Fleet
from laneway.runtime.metrics import Metrics
from laneway.runtime.prefix import prefix_of
from laneway.runtime.probes import Prober
from laneway.runtime.recovery import Recovery
from laneway.runtime.rejections import error_for, held_too_much, shutting_down
from laneway.runtime.saturation import Saturation, Window
from laneway.runtime.scheduling import SchedulerPort
from laneway.runtime.sizing import Sizing
from laneway.runtime.support import support_of
from laneway.runtime.ticket import Phase, Ticket
from laneway.runtime.topology import topology
from laneway.tracing import OFF, Tracing

log = logging.getLogger("laneway.runtime")


class Runtime(WorkerEvents):
    def __init__(self, config: ServerConfig, workers: Mapping[str, Worker]) -> None:
        self.config = config
        self.workers = dict(workers)
        topo = topology(config, self.workers)
        self.served = topo.served
        self.upstream_model = topo.upstream_model
        self.ranked = topo.ranked
        self.placed_by_prefix = topo.placed_by_prefix
        self.specs = specs = topo.specs
        # a fleet's core places models on GPUs (its engines come and go as workers)
        self.fleet = Fleet.of(self, config) if config.fleet is not None else None
        # the core in this process; a cluster's replica puts its leader's here (use_scheduler)
        self.sched: SchedulerPort = (
            self.fleet.core if self.fleet is not None else Scheduler(specs, config.scheduler, config.policy)
        )
        self.support = support_of(self.workers, self.served)
        if self.fleet is not None:
            self.support.update(self.fleet.support())
        self.sizing = Sizing(config.scheduler.costs, config.default_max_tokens, self.context_of)
        self.classes = config.scheduler.classes
        self.stoppable = stoppable_classes(self.classes, config.policy)
        names = self.classes.names
        thresholds = dict(zip(names, config.alert_wait_s, strict=False))
        self.metrics = Metrics(names, thresholds)
        self.alerts = QueueWaitAlerts(config.alert_wait_s, self._alerted)
        self.recovery = Recovery(self)
        windows = {
            w.name: Window(w.slots, w.min_slots, w.slots)
            for w in config.workers
            if w.type == "upstream" and w.adapt_slots and w.name in self.workers
        }
        # what the engines say of themselves at each probe (KV space, load, prefix hits)
        self.engines = EngineWatch(
            self.workers,
            topo.kv_tokens,
            Saturation(windows),
            lambda: self.sched,
            self.metrics,
            self.kick,
            lambda worker, n: self.recovery.take_back(worker, n),
            self.spawn,
        )
        self.prober = Prober(self, config.probe_interval_s, config.unavailable_hold_s)
        self.tickets: dict[str, Ticket] = {}
        self.tracing = OFF  # (the server's, where traces are configured: laneway.tracing)
        self.held_bytes = 0  # of the clients' requests in tickets (ServerConfig.max_queued_bytes)
        # per tenant ("" without one): requests completed, prompt and completion tokens (the dashboard)
        self.usage: dict[str, list[int]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._step_pending = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False

    async def calibrate(self) -> CostModel | None:
        """Before the first request: measure the in-process engines for the
        scheduler's cost model when the configuration gives none
        (:mod:`laneway.runtime.costs`). Returns the cost model taken, if any."""
        sched = self.sched
        if self.config.scheduler.costs != CostModel() or self.tickets or not isinstance(sched, Scheduler):
            return None
        costs = await measured_costs(self.workers, self.config.scheduler.costs)
        if costs is None:
            return None
        # nothing was submitted yet: only the costs change, no new scheduler needed
        sched.use_costs(costs)
        self.sizing.costs = costs
        log.info(
            "preemption costs measured: decode step %.1f ms, prefill %.0f tokens/s, KV %d bytes/token",
            costs.step_s * 1e3,
            costs.prefill_tokens_s,
            costs.kv_bytes_per_token,
        )
        return costs

    def use_scheduler(self, sched: SchedulerPort) -> None:
        """Schedule through ``sched`` instead of this process's core (before any request)."""
        assert not self.tickets, "the scheduler is chosen before the first request"
        self.sched = sched

    async def start(self) -> None:
        """Probe the workers (and keep probing them), start a fleet's preloaded engines;
        call once the loop runs."""
        await self.prober.start()
        if self.fleet is not None:
            await self.fleet.start()

    # ------------------------------------------------------------------ clock
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def now(self) -> float:
        return self.loop.time()

    @property
    def models(self) -> tuple[str, ...]:
        if self.fleet is not None:  # (whether loaded or not)
            return tuple(self.fleet.cfg.inventory.models)
        return tuple(dict.fromkeys(self.served.values()))

    # ------------------------------------------------------------------ arrivals
    def submit(
        self,
        job: Job,
        priority: int,
        *,
        tenant: str | None = None,
        preemptible: bool = True,
        timeout_s: float | None = None,
        deltas: bool = True,
        size: int = 0,
        traceparent: str | None = None,
        tracestate: str | None = None,
    ) -> Ticket:
        """Queue ``job``; raise the :class:`RequestError` of a refusal.

        ``deltas=False``: the ticket gives only the ``Done`` (with all the text), not each ``Delta``.
        ``size``: the bytes of the client's request, counted against ``max_queued_bytes`` while
        it lives (0: not counted; batch lines are bounded by the runner's lines in flight).
        ``traceparent``, ``tracestate``: the client's W3C trace context (its span continues
        that trace).
        """
        if self.closed:
            raise shutting_down()
        trace = (traceparent, tracestate)
        if size and self.held_bytes + size > self.config.max_queued_bytes:
            wait = self.estimate_wait(priority, job.model)
            overloaded = held_too_much(self.held_bytes, self.config.max_queued_bytes, size, wait)
            raise self._refused(job, priority, tenant, trace, "overloaded", overloaded)
        if self.fleet is not None:
            refused_now = self.fleet.faults.refusal(job.model)
            if refused_now is not None:
                raise self._refused(job, priority, tenant, trace, "unavailable", refused_now)
        self._admit(job)
        serving = self.prober.serving(job.model)
        if not serving and self.prober.hold_s <= 0:
            unavailable = self.prober.unavailable(job.model)
            raise self._refused(job, priority, tenant, trace, "unavailable", unavailable)
        now = self.now()
        sizing = self.sizing
        req = Request(
            job.id,
            priority,
            now,
            model=job.model,
            tenant=tenant,
            preemptible=preemptible,
            est_service_s=sizing.service_s(job),
            prompt_tokens=sizing.prompt_tokens(job),
            output_tokens=sizing.output_tokens(job),
            prefix=prefix_of(job) if job.model in self.placed_by_prefix else (),
        )
        if timeout_s is not None:
            req.timeout_s = timeout_s
        refused = self.sched.submit(req, now)
        if refused is not None:
            raise self._refused(job, priority, tenant, trace, refused.reason, error_for(refused))
        ticket = Ticket(
            job, priority, self.classes[priority].name, tenant, now, enqueued_s=now, deltas=deltas, size=size
        )
        if not preemptible or priority not in self.stoppable:
            ticket.resume = ResumeMethod.NONE  # (never stopped once started: laneway.resume says so)
        self.held_bytes += size
        self.tickets[job.id] = ticket
        self.tracing.arrived(ticket, traceparent, tracestate)
        self.alerts.watch(ticket, now)
        if not serving:
            self.prober.hold(ticket, now)
        self.kick()
        return ticket

    def _admit(self, job: Job) -> None:
        """Refuse now a job that no worker of its model could ever run (a prompt past the
        context of them all), rather than after it waited for one."""
        refusal: RequestError | None = None
        for worker in self.workers_of(job.model):
            try:
                worker.admit(job)
            except RequestError as exc:
                refusal = refusal or exc
            else:
                return
        if refusal is not None:
            raise refusal

    def _refused(
        self,
        job: Job,
        priority: int,
        tenant: str | None,
        trace: tuple[str | None, str | None],
        reason: str,
        error: RequestError,
    ) -> RequestError:
        """A request refused on arrival (a quota, a queue bound, no worker up): counted,
        traced and logged as one that ended rejected, as one refused after it queued is."""
        name = self.classes[priority].name
        self.metrics.count_rejection(reason, tenant)
        self.metrics.ended[name, "rejected"].inc()
        self.metrics.tenant_ended(tenant, "rejected", None)
        ticket = Ticket(job, priority, name, tenant, self.now())
        self.tracing.arrived(ticket, *trace)
        self.tracing.ended(ticket, "rejected", None, error.message)
        request_ended(job.id, tenant, name, None, 0.0, 0, "rejected", None, None)
        return error

    def workers_of(self, model: str) -> list[Worker]:
        """The workers serving ``model``."""
        return [worker for name, worker in self.workers.items() if self.served.get(name, name) == model]

    def contexts(self, model: str) -> list[int | None]:
        """The context, in tokens, of each worker serving ``model`` (``None``: it does not say)."""
        return [n if isinstance(n := w.max_model_len, int) else None for w in self.workers_of(model)]

    def context_of(self, model: str) -> int | None:
        """The longest context a worker serving ``model`` takes (``None`` where one of them
        does not say): no request of it runs past that."""
        lengths = self.contexts(model)
        if not lengths or None in lengths:
            return None
        return max(n for n in lengths if n is not None)

    def trace(self, tracing: Tracing) -> None:
        """Trace requests from now on (:mod:`laneway.tracing`); upstream workers' calls carry
        their runs' ``traceparent`` (a fleet's engines too, as they come)."""
        self.tracing = tracing
        for worker in self.workers.values():
            tracing.carried_by(worker)

    def estimate_wait(self, priority: int, model: str | None) -> float:
        return self.sched.estimate_wait(priority, model, self.now())

    def estimate_range(self, priority: int, model: str | None) -> tuple[float, WaitRange]:
        return self.sched.estimate_range(priority, model, self.now())

    def cancel(self, ticket: Ticket, error: RequestError | None = None) -> None:
        """The client went away (or the server is closing): end ``ticket`` wherever it is."""
        if ticket.ended:
            return
        phase = ticket.phase
        self.sched.cancel(ticket.id, self.now(), tokens=ticket.tokens)  # (what it streamed is charged)
        worker = self.workers.get(ticket.worker) if ticket.worker is not None else None
        if worker is not None and phase in (Phase.RUNNING, Phase.STOPPING):
            self.spawn(worker.cancel(ticket.id))
        self._drop_checkpoint(ticket)
        self._end(ticket, error or ClientGone("the request was cancelled"), "cancelled")
        self.kick()

    # ------------------------------------------------------------------ the step
    def kick(self) -> None:
        """Run a scheduling step soon (once per loop turn however often kicked)."""
        if not self._step_pending and not self.closed:
            self._step_pending = True
            self.loop.call_soon(self._step)

    def _step(self) -> None:
        self._step_pending = False
        if self.closed:
            return
        now = self.now()
        self.alerts.due(now)
        apply(self.sched.schedule(now), self, now)
        self._arm(now)

    def _arm(self, now: float) -> None:
        wake = min(self.sched.next_wakeup(), self.alerts.next_due())
        if wake == self._timer_at and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = wake
        if wake < math.inf:
            self._timer = self.loop.call_at(max(wake, now), self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        self.kick()

    # ------------------------------------------------------------------ decisions (an Actuator)
    def dispatch(self, d: Dispatch, now: float) -> None:
        ticket = self.tickets.get(d.request_id)
        if ticket is None:  # ended here before the decision came (a scheduler in another process)
            self.sched.finished(d.request_id, now, failed=True)
            return
        if ticket.phase is not Phase.QUEUED:  # (it runs already: a decision came twice)
            log.warning(
                "request %s is %s: a dispatch to %s ignored", ticket.id, ticket.phase.name, d.worker_id
            )
            return
        worker = self.workers.get(d.worker_id)
        ticket.queue_s += now - ticket.enqueued_s
        self.alerts.check(ticket, now)
        if math.isnan(ticket.first_start_s):
            ticket.first_start_s = now
            self.metrics.waited[ticket.class_name].observe(now - ticket.arrival_s)
        ticket.phase = Phase.RUNNING
        ticket.worker = d.worker_id
        ticket.run += 1
        if worker is None:  # (an engine of a cluster's fleet that cannot be reached from here, or
            # one whose worker left as the decision came): it is placed again, as a failed start is
            gone = UpstreamUnavailable(
                f"worker {d.worker_id} cannot be reached from here", worker_fault=False
            )
            self._failed(ticket, ticket.run, gone)
            return
        sink = self._sink(ticket, ticket.run, worker)
        ckpt, ticket.checkpoint = ticket.checkpoint, None
        self.tracing.run_started(ticket, d.worker_id, ckpt is not None)
        if ckpt is not None:
            self._held -= ckpt.nbytes
            start = worker.resume(ckpt, sink)
        else:
            job = ticket.job
            if ticket.resume is not ResumeMethod.NONE:
                ticket.resume = worker.resume_method(job)
            model = self.upstream_model.get(d.worker_id, job.model)
            if self.fleet is not None and job.model in self.fleet.adapters.names:  # (an adapter of its model)
                model = self.fleet.adapters.names[job.model]
            if d.worker_id in self.ranked:  # its engine orders its own queue by laneway's class
                job = replace(job, model=model, rank=ticket.priority)
            elif model != job.model:
                job = replace(job, model=model)
            start = worker.run(job, sink)
        self.spawn(self._started(ticket, ticket.run, start))
        self.engines.started(d.worker_id, worker)

    async def _started(self, ticket: Ticket, run: int, start: object) -> None:
        try:
            await start  # type: ignore[misc]
        except RequestError as exc:  # it cannot run as asked (e.g. the prompt is too long)
            self._failed(ticket, run, exc)
        except Exception as exc:
            log.exception("worker %s could not start %s", ticket.worker, ticket.id)
            self._failed(ticket, run, GenerationFailed(f"worker {ticket.worker} could not start it: {exc}"))

    def preempt(self, d: Preempt, now: float) -> None:
        ticket = self.tickets.get(d.request_id)
        if ticket is None or ticket.phase is not Phase.RUNNING:
            return  # (it ended, or stopped, before the decision came)
        worker = self.workers.get(d.worker_id)
        if worker is None:  # (a fleet's engine that died: the request fails over from it)
            return
        ticket.phase = Phase.STOPPING
        self.spawn(worker.preempt(d.request_id, d.mode))

    def reject(self, d: Reject, now: float) -> None:
        ticket = self.tickets.get(d.request_id)
        self.metrics.count_rejection(d.reason, ticket.tenant if ticket is not None else None)
        if ticket is not None:
            self._drop_checkpoint(ticket)
            self._end(ticket, error_for(d), "rejected")

    def load(self, d: Load, now: float) -> None:
        if self.fleet is None:  # (a scheduler of another process's: a leader's)
            log.error("ignoring a decision to load %s: this server has no fleet", d.model)
            return
        self.fleet.load(d, now)

    def evict(self, d: Evict, now: float) -> None:
        if self.fleet is None:
            log.error("ignoring a decision to evict %s: this server has no fleet", d.model)
            return
        self.fleet.evict(d, now)

    def load_adapter(self, d: LoadAdapter, now: float) -> None:
        if self.fleet is None:
            log.error("ignoring a decision to load adapter %s: this server has no fleet", d.adapter)
            return
        self.fleet.adapters.load(d)

    def unload_adapter(self, d: UnloadAdapter, now: float) -> None:
        if self.fleet is None:
            log.error("ignoring a decision to unload adapter %s: this server has no fleet", d.adapter)
            return
        self.fleet.adapters.unload(d)

    def withdraw(self, ticket: Ticket, err: Unavailable) -> None:
        """Refuse queued ``ticket`` now with ``err`` (it cannot be served for a while)."""
        decision = self.sched.withdraw(ticket.id, self.now(), "unavailable", err.message, err.retry_after_s)
        self.metrics.count_rejection(decision.reason, ticket.tenant)
        self._drop_checkpoint(ticket)
        self._end(ticket, err, "rejected")

    # ------------------------------------------------------------------ plumbing
    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("runtime task failed", exc_info=task.exception())

    def end_requests(self) -> None:
        """Refuse new requests and end every one in flight (503 to waiting clients,
        an error event to streams): the server is shutting down."""
        for ticket in list(self.tickets.values()):
            self.cancel(ticket, shutting_down())
        self.closed = True

    async def close(self) -> None:
        """End every request and close the workers."""
        self.end_requests()
        await self.prober.close()
        if self.fleet is not None:  # (its engines stop while the requests they ran end)
            fleet_closing = self.loop.create_task(self.fleet.close())
        if self._timer is not None:
            self._timer.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)
        for worker in self.workers.values():
            try:
                await worker.close()
            except Exception:
                log.exception("closing worker %s failed", worker.name)
        if self.fleet is not None:
            await fleet_closing
        await asyncio.to_thread(self.tracing.close)  # (the spans left are sent: blocking I/O)
