"""Failing workers: retry elsewhere, take the worker out, bring it back when healthy.

When a worker fails a request with a retryable error (an upstream that cannot
be reached, a 429/5xx answer, a timeout) before the request streamed
anything, the request goes back to the head of its queue (it keeps its
arrival) and runs on whichever worker the scheduler picks next, at most
:data:`MAX_RETRIES` times and only while another worker serving its model is
up (else it fails at once, 502, rather than wait). The failing worker is taken out of placement and
probed with ``health()`` (backing off from :data:`PROBE_FIRST_S` to
:data:`PROBE_MAX_S`) until it answers healthy again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from laneway.runtime.ticket import Phase, Ticket

if TYPE_CHECKING:
    from laneway.runtime.runtime import Runtime

log = logging.getLogger("laneway.runtime")

MAX_RETRIES = 2
PROBE_FIRST_S = 1.0
PROBE_MAX_S = 30.0


class Recovery:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.down: set[str] = set()

    def retry(self, ticket: Ticket, error: Exception) -> bool:
        """Queue ``ticket`` again after a retryable failure; ``False`` if it may not be."""
        if not getattr(error, "retryable", False) or ticket.tokens > 0 or ticket.retries >= MAX_RETRIES:
            return False
        rt = self.rt
        worker = ticket.worker
        if worker is not None:
            self.take_out(worker)
        others = [w for w, model in rt.served.items() if model == ticket.job.model and w not in self.down]
        if not others:  # nowhere else to run it now: fail rather than wait for a recovery
            return False
        now = rt.now()
        rt.sched.requeue(ticket.id, now)
        ticket.retries += 1
        ticket.phase = Phase.QUEUED
        ticket.enqueued_s = now
        rt.alerts.watch(ticket, now)
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

    def take_out(self, worker: str) -> None:
        if worker in self.down:
            return
        self.down.add(worker)
        self.rt.sched.set_available(worker, False)
        self.rt.spawn(self._probe(worker))

    async def _probe(self, worker: str) -> None:
        delay = PROBE_FIRST_S
        while not self.rt.closed:
            await asyncio.sleep(delay)
            try:
                healthy = (await self.rt.workers[worker].health()).ok
            except Exception:  # a probe that breaks is an unhealthy answer
                healthy = False
            if healthy:
                self.down.discard(worker)
                self.rt.sched.set_available(worker, True)
                log.warning("worker %s is healthy again", worker)
                self.rt.kick()
                return
            delay = min(delay * 2, PROBE_MAX_S)
