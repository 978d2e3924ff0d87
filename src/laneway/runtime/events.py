"""What the runtime does with the events workers send back.

A mixin of :class:`~laneway.runtime.runtime.Runtime`. Each dispatch gets a
sink bound to the ticket and its run number, so events of a run that was
preempted or cancelled cannot touch a later one.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from laneway.backends.base import Sink, Worker
from laneway.core import InvalidTransition, UnknownRequest
from laneway.errors import ClientGone, GenerationFailed, RequestError
from laneway.generation import Checkpoint, Delta, Done, Event, Failed, Stopped
from laneway.logs import request_ended
from laneway.runtime import fleet_view
from laneway.runtime.ticket import Phase, Ticket, count_by_class
from laneway.tracing import Tracing

if TYPE_CHECKING:
    from laneway.runtime.alerts import QueueWaitAlerts
    from laneway.runtime.fleet import Fleet
    from laneway.runtime.metrics import Metrics
    from laneway.runtime.probes import Prober
    from laneway.runtime.recovery import Recovery
    from laneway.runtime.scheduling import SchedulerPort
    from laneway.runtime.sizing import Sizing

log = logging.getLogger("laneway.runtime")

ENGINE_REFUSED = "engine_refused"  # a rejection's reason: its upstream answered 4xx before any token
PROGRESS_EVERY = 16  # tokens: progress is reported at 16, 48, 112, ... (each gap doubles)


class WorkerEvents:
    """What :class:`~laneway.runtime.runtime.Runtime` does with its workers' events; the
    attributes below are the runtime's, declared here for what these methods use."""

    _held = 0  # bytes of checkpoints held for preempted requests
    sched: SchedulerPort
    workers: dict[str, Worker]
    tickets: dict[str, Ticket]
    held_bytes: int
    usage: dict[str, list[int]]
    metrics: Metrics
    prober: Prober
    alerts: QueueWaitAlerts
    recovery: Recovery
    sizing: Sizing
    fleet: Fleet | None
    tracing: Tracing

    if TYPE_CHECKING:

        def now(self) -> float: ...

        def kick(self) -> None: ...

    def _sink(self, ticket: Ticket, run: int, worker: Worker) -> Sink:
        def sink(event: Event) -> None:
            if ticket.ended or ticket.run != run:
                if isinstance(event, Stopped):  # nobody will resume it
                    worker.discard(event.checkpoint)
                return
            if isinstance(event, Delta):
                self._delta(ticket, event)
            elif isinstance(event, Done):
                self._done(ticket, event)
            elif isinstance(event, Stopped):
                self._stopped(ticket, event)
            elif isinstance(event, Failed):
                self._failed(ticket, run, event.error)

        return sink

    def _delta(self, ticket: Ticket, event: Delta) -> None:
        if math.isnan(ticket.first_token_s):  # (its answer began: a chunk was sent)
            ticket.first_token_s = self.now()
        # (its first token, not a chunk of a role alone: its prompt is prefilled; work kept
        # off its worker meanwhile may start)
        if (
            not ticket.token_timed
            and event.tokens > 0
            and self.sched.first_token(ticket.id, self._first_token(ticket))
        ):
            self.kick()
        tokens = ticket.tokens = event.tokens
        if tokens >= 2 * ticket.reported + PROGRESS_EVERY:  # now and then: the pace revises its size
            ticket.reported = tokens
            self.sched.progress(ticket.id, tokens, self.now())
        ticket.put(event)

    def _first_token(self, ticket: Ticket) -> float:
        """Its first token came (or its whole answer, with none before): its time to it.
        Returns the time now."""
        ticket.token_timed = True
        now = self.now()
        if math.isnan(ticket.first_token_s):
            ticket.first_token_s = now
        self.metrics.first_token[ticket.class_name].observe(now - ticket.arrival_s)
        return now

    def _done(self, ticket: Ticket, event: Done) -> None:
        if event.finish_reason == "cancelled":  # not asked by us: the worker gave up on it
            self._failed(
                ticket, ticket.run, GenerationFailed(f"worker {ticket.worker} cancelled the request")
            )
            return
        if not ticket.token_timed:
            self._first_token(ticket)
        now = self.now()
        usage = event.usage
        self.sched.finished(ticket.id, now, tokens=usage.completion_tokens, prompt_tokens=usage.prompt_tokens)
        self.metrics.took[ticket.class_name].observe(now - ticket.arrival_s)
        if self.fleet is not None:
            self.fleet.ran(ticket.worker)
        if not ticket.preemptions:  # one run: its pace is the model's
            self.sizing.observe(ticket.job.model, usage.completion_tokens, now - ticket.first_token_s)
        self._end(ticket, event, "completed")
        self.kick()

    def _stopped(self, ticket: Ticket, event: Stopped) -> None:
        now = self.now()
        ckpt = event.checkpoint
        try:
            self.sched.preempted(
                ticket.id, now, tokens_done=ckpt.tokens_done, checkpoint_bytes=ckpt.nbytes, save_s=ckpt.save_s
            )
        except (InvalidTransition, UnknownRequest):  # stopped without being asked: cannot resume it
            self._discard(ticket.worker, ckpt)
            self._failed(ticket, ticket.run, GenerationFailed(f"worker {ticket.worker} stopped the request"))
            return
        ticket.checkpoint = ckpt
        ticket.resume = ckpt.mode
        self.tracing.preempted(ticket, ckpt.mode, ckpt.tokens_done, ckpt.nbytes)
        self._held += ckpt.nbytes
        ticket.preemptions += 1
        ticket.phase = Phase.QUEUED
        ticket.enqueued_s = now
        if not self.prober.serving(ticket.job.model):  # (its worker went down as it was stopped)
            self.prober.hold(ticket, now)
        self.metrics.preempted[ticket.class_name].inc()
        self.metrics.checkpoint_bytes.inc(ckpt.nbytes)
        self.alerts.watch(ticket, now)
        self.kick()

    def _failed(self, ticket: Ticket, run: int, error: Exception) -> None:
        if ticket.ended or ticket.run != run:
            return
        if ticket.phase is not Phase.QUEUED:
            if self.recovery.retry(ticket, error):
                return
            error = self.recovery.gave_up(ticket, error)
        # refused by the engine before it made anything (a 4xx: too long, bad ids): its
        # tenant is charged nothing for it, and it ends rejected, as one refused here would
        refused = isinstance(error, RequestError) and error.status < 500 and not ticket.tokens
        try:
            self.sched.finished(
                ticket.id, self.now(), failed=True, tokens=ticket.tokens, prompt_tokens=0 if refused else None
            )
        except (InvalidTransition, UnknownRequest):
            self.sched.cancel(ticket.id, self.now(), tokens=ticket.tokens)
        if not isinstance(error, RequestError):
            log.error("request %s failed on worker %s: %s", ticket.id, ticket.worker, error)
            error = GenerationFailed(f"generation failed on worker {ticket.worker}: {error}")
        if refused:  # (counted by why, as every request that ends rejected is)
            self.metrics.count_rejection(ENGINE_REFUSED, ticket.tenant)
        self._end(ticket, error, "rejected" if refused else "failed")
        self.kick()

    def _end(self, ticket: Ticket, item: Done | RequestError, outcome: str) -> None:
        if ticket.phase is Phase.QUEUED:  # (ended in the queue: timed out, cancelled, shut down)
            now = self.now()
            ticket.queue_s += now - ticket.enqueued_s
            if math.isnan(ticket.first_start_s):  # (its wait, never to end in a start)
                self.metrics.waited[ticket.class_name].observe(now - ticket.arrival_s)
        ticket.phase = Phase.ENDED
        if self.tickets.pop(ticket.id, None) is not None:
            self.held_bytes -= ticket.size
        self.metrics.ended[ticket.class_name, outcome].inc()
        usage = item.usage if isinstance(item, Done) else None
        tokens = (usage.prompt_tokens, usage.completion_tokens) if usage is not None else None
        self.metrics.tenant_ended(ticket.tenant, outcome, tokens)
        if usage is not None:
            tally = self.usage.get(ticket.tenant or "")
            if tally is None:
                tally = self.usage[ticket.tenant or ""] = [0, 0, 0]
            tally[0] += 1
            tally[1] += usage.prompt_tokens
            tally[2] += usage.completion_tokens
        failed = item.message if isinstance(item, RequestError) and not isinstance(item, ClientGone) else None
        self.tracing.ended(ticket, outcome, tokens, failed)
        request_ended(
            ticket.id,
            ticket.tenant,
            ticket.class_name,
            ticket.worker,
            ticket.queue_s,
            ticket.preemptions,
            outcome,
            usage.prompt_tokens if usage is not None else None,
            # (one that ended without usage: what it made until then, if anything)
            usage.completion_tokens if usage is not None else ticket.tokens or None,
        )
        ticket.put(item)

    def _drop_checkpoint(self, ticket: Ticket) -> None:
        ckpt, ticket.checkpoint = ticket.checkpoint, None
        if ckpt is not None and ticket.worker is not None:
            self._held -= ckpt.nbytes
            self._discard(ticket.worker, ckpt)

    def _discard(self, name: str | None, ckpt: Checkpoint) -> None:
        worker = self.workers.get(name) if name is not None else None
        if worker is not None:  # (a worker gone — a fleet's evicted replica — holds nothing)
            worker.discard(ckpt)

    def _alerted(self, ticket: Ticket) -> None:
        self.metrics.alerted[ticket.class_name].inc()

    def refresh_metrics(self) -> None:
        """Bring the present-tense gauges up to date (before a scrape)."""
        snap = self.sched.snapshot()
        counts = count_by_class(self.tickets.values(), self.now())  # (as the dashboard counts)
        slots = {}
        for name, worker in self.workers.items():
            cap = worker.capacity()
            slots[name] = (cap.slots, cap.busy)
        self.metrics.refresh(
            counts.queued,
            counts.running,
            counts.oldest_s,
            slots,
            self._held,
            snap.prefix_hits,
            down=self.prober.down,
        )
        if self.fleet is not None:
            fleet_view.refresh_metrics(self.fleet)
