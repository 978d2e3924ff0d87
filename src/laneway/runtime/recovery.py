"""Failing workers: a request a worker could not run goes elsewhere.

When a worker fails a request with a retryable error (an upstream that cannot
be reached, stalled, or answered 429/502–504), the worker is taken out of
placement until a probe finds it healthy again (:mod:`laneway.runtime.probes`).
One that answered with something that is no answer (a 200 that is not a stream,
a chunk that is not JSON, more tokens than asked) is up: it stays in placement,
and its probe says whether it is well. One that broke its answer off (the
connection lost after the answer began: its engine died, or choked on that one
request) is taken out and probed at once: back within moments if it is up, out
if it is gone (a request sent to it again would have found it dead). A run that
never reached its worker (no connection could be made; a kept-alive connection
the upstream closed as it went out) is tried again without spending a try or a
migration (at most :data:`MAX_UNSENT` times). An upstream's 500 is that one
request's failure: it is not tried again.
If the request streamed nothing yet, it goes back to the head of its queue
(it keeps its arrival) and runs on whichever worker the scheduler picks next,
at most :data:`MAX_RETRIES` times — unless its client streams and has events of
it already (a Responses stream's first ones, a chat's role): those would come
twice. Then, where the workers only said they could not take it (unreachable,
stalled, busy: 429, 502–504), it gets 503 ``upstream_unavailable`` with a
``Retry-After``, not a 502 (:meth:`Recovery.gave_up`). If it streamed, and the
worker says where it stopped (an upstream that died or stalled mid-stream), it
goes on from there on another worker, as a preempted request would — the
client's stream just continues — at most ``max_migrations`` times; with no
worker for its model up, it is held like any request of that model (503 once
the hold is over).

A request waiting in an engine's own queue (the saturation gate saw it queue:
:mod:`laneway.runtime.saturation`) is taken back the same way: stopped there
before it made anything, and queued again in laneway, where priority holds.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from laneway.errors import RequestError, Unavailable
from laneway.generation import Checkpoint
from laneway.runtime.ticket import Phase, Ticket

if TYPE_CHECKING:
    from laneway.runtime.runtime import Runtime

log = logging.getLogger("laneway.runtime")

MAX_RETRIES = 2
# runs that never reached their worker (no connection could be made) tried again without
# spending a try or a migration: the worker they failed on is out of placement by then
MAX_UNSENT = 4


class Recovery:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    @property
    def down(self) -> set[str]:
        """Workers out of placement now."""
        return self.rt.prober.down

    def retry(self, ticket: Ticket, error: Exception) -> bool:
        """Queue ``ticket`` again after a retryable failure; ``False`` if it may not be."""
        if not getattr(error, "retryable", False):
            return False
        rt = self.rt
        worker = ticket.worker
        cut = getattr(error, "cut", False)
        if worker is not None and getattr(error, "worker_fault", True):
            if getattr(error, "malformed", False) and not cut:  # up: it answered; it stays in placement
                fleet = rt.fleet
                if (
                    fleet is not None
                    and fleet.owns(worker)
                    and fleet.run_failed(worker, ticket.id, str(error))
                ):
                    return False  # (that took its engines for broken: it ends, none is started for it)
            else:
                rt.prober.take_out(worker, str(error))
                if cut:  # (its answer broken off: back at once if a probe finds it up, else gone)
                    rt.prober.check(worker)
        checkpoint: Checkpoint | None = getattr(error, "checkpoint", None)
        if getattr(error, "unsent", False) and ticket.unsent < MAX_UNSENT:
            ticket.unsent += 1  # (it never reached the worker: a try, or a migration, not spent)
            return self._again(ticket, worker, error, checkpoint)
        if ticket.tokens == 0 and ticket.job.stream and not math.isnan(ticket.first_token_s):
            return False  # its client has events of it (a Responses stream's first ones): not again
        if ticket.tokens > 0:  # it streamed: it may go on elsewhere only from where it stopped
            if checkpoint is None or ticket.migrations >= rt.config.max_migrations:
                return False
            ticket.migrations += 1
        elif ticket.retries >= MAX_RETRIES:
            return False
        else:
            ticket.retries += 1
        return self._again(ticket, worker, error, checkpoint)

    def _again(
        self, ticket: Ticket, worker: str | None, error: Exception, checkpoint: Checkpoint | None
    ) -> bool:
        """Queue ``ticket`` again (from ``checkpoint`` where it streamed)."""
        rt = self.rt
        if ticket.tokens > 0:
            if checkpoint is None:
                return False
            ticket.checkpoint = checkpoint
            ticket.resume = checkpoint.mode
        now = rt.now()
        rt.sched.requeue(ticket.id, now, failed=True)
        ticket.phase = Phase.QUEUED
        ticket.enqueued_s = now
        rt.alerts.watch(ticket, now)
        if not rt.prober.serving(ticket.job.model):
            rt.prober.hold(ticket, now)
        if getattr(error, "unsent", False):
            log.warning("request %s did not reach worker %s (%s); queued again", ticket.id, worker, error)
        elif ticket.tokens > 0:
            log.warning(
                "request %s: worker %s failed after %d tokens (%s); "
                "queued again to go on from there (migration %d of %d)",
                ticket.id,
                worker,
                ticket.tokens,
                error,
                ticket.migrations,
                rt.config.max_migrations,
            )
        else:
            log.warning(
                "request %s failed on worker %s (%s); retrying (%d/%d)",
                ticket.id,
                worker,
                error,
                ticket.retries,
                MAX_RETRIES,
            )
        rt.kick()
        return True

    def gave_up(self, ticket: Ticket, error: Exception) -> Exception:
        """What ``ticket`` ends with once :meth:`retry` would not try ``error`` again: a
        request that made nothing and whose tries the workers only said they could not take
        (unreachable, stalled, busy) gets 503 ``upstream_unavailable`` — come back later —
        rather than a 502, which says the generation failed; else ``error`` itself."""
        unavailable = getattr(error, "retryable", False) and not getattr(error, "malformed", True)
        if not unavailable or ticket.tokens or isinstance(error, RequestError):
            return error
        tries = ticket.retries + 1
        return Unavailable(
            f"{error} ({tries} tr{'ies' if tries > 1 else 'y'} on the workers of model "
            f"{ticket.job.model!r}; try again later)",
            code="upstream_unavailable",
            retry_after_s=math.ceil(self.rt.prober.retry_after(ticket.job.model)),
        )

    def take_back(self, worker: str, n: int) -> int:
        """Take back up to ``n`` of the requests running on ``worker`` that have made nothing
        yet (the lowest class first, the last queued first): each is stopped there and
        queued again, at the head of its class. How many were."""
        rt = self.rt
        runs = [
            t
            for t in rt.tickets.values()
            if t.worker == worker
            and t.phase is Phase.RUNNING
            and not t.tokens
            and math.isnan(t.first_token_s)
        ]
        runs.sort(key=lambda t: (t.priority, t.enqueued_s), reverse=True)
        taken = runs[:n]
        w = rt.workers.get(worker)
        now = rt.now()
        for ticket in taken:
            ticket.run += 1  # (what the stopped run still sends is stale)
            if w is not None:
                rt.spawn(w.cancel(ticket.id))
            rt.sched.requeue(ticket.id, now)
            ticket.phase = Phase.QUEUED
            ticket.enqueued_s = now
            rt.alerts.watch(ticket, now)
        if taken:
            rt.kick()
        return len(taken)
