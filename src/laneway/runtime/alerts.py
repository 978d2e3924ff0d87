"""Queue-wait alerts: a request queued longer than its class threshold is
logged once as a structured warning and counted.

Time queued adds up over every visit to the queue (a preempted request
queues again). The runtime calls :meth:`QueueWaitAlerts.watch` whenever a
ticket enters the queue, :meth:`QueueWaitAlerts.due` on its timer and
:meth:`QueueWaitAlerts.check` when a ticket leaves the queue.
"""

from __future__ import annotations

import heapq
import json
import logging
import math
from collections.abc import Callable, Sequence

from laneway.runtime.ticket import Phase, Ticket

log = logging.getLogger("laneway.alerts")


class QueueWaitAlerts:
    def __init__(self, thresholds: Sequence[float | None], on_alert: Callable[[Ticket], None]) -> None:
        self.thresholds = tuple(thresholds)
        self.on_alert = on_alert
        self._heap: list[tuple[float, int, Ticket]] = []
        self._seq = 0

    def threshold(self, ticket: Ticket) -> float | None:
        return self.thresholds[ticket.priority] if ticket.priority < len(self.thresholds) else None

    def watch(self, ticket: Ticket, now: float) -> None:
        """``ticket`` (re)entered the queue at ``now``."""
        limit = self.threshold(ticket)
        if limit is None or ticket.alerted:
            return
        self._seq += 1
        heapq.heappush(self._heap, (now + max(limit - ticket.queue_s, 0.0), self._seq, ticket))

    def next_due(self) -> float:
        return self._heap[0][0] if self._heap else math.inf

    def due(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, ticket = heapq.heappop(heap)
            if ticket.phase is Phase.QUEUED and not ticket.alerted:
                self.check(ticket, now, queued_now=True)

    def check(self, ticket: Ticket, now: float, *, queued_now: bool = False) -> None:
        """Alert if ``ticket`` has been queued past its threshold (once)."""
        limit = self.threshold(ticket)
        if limit is None or ticket.alerted:
            return
        waited = ticket.queue_s + (now - ticket.enqueued_s if queued_now else 0.0)
        if waited < limit:
            return
        ticket.alerted = True
        fields = {
            "event": "queue_wait_alert",
            "request_id": ticket.id,
            "class": ticket.class_name,
            "tenant": ticket.tenant,
            "waited_s": round(waited, 3),
            "threshold_s": limit,
            "preemptions": ticket.preemptions,
        }
        log.warning(json.dumps(fields), extra={"laneway": fields})
        self.on_alert(ticket)
