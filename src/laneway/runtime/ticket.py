"""A request in flight, as the HTTP handler waiting on it sees it.

The runtime puts :class:`~laneway.generation.Delta` (new text),
:class:`~laneway.generation.Done` (the end) or a
:class:`~laneway.errors.RequestError` (refused, expired, failed) on the
ticket's channel; the handler reads them with :meth:`Ticket.next`,
:meth:`Ticket.events` or :meth:`Ticket.result`. Text is continuous across
preemptions: a resumed job only adds what it had not written yet. A ticket
made with ``deltas=False`` (a non-streaming answer) keeps only the end: its
``Done`` carries the whole text.
"""

from __future__ import annotations

import asyncio
import enum
import math
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from laneway.errors import RequestError
from laneway.generation import Checkpoint, Delta, Done, Job, ResumeMethod

Item = Delta | Done | RequestError


class Phase(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    STOPPING = "stopping"  # told to preempt; waiting for its Stopped event
    ENDED = "ended"


@dataclass(eq=False, slots=True)
class Ticket:
    job: Job
    priority: int  # class rank
    class_name: str
    tenant: str | None
    arrival_s: float  # runtime clock
    phase: Phase = Phase.QUEUED
    worker: str | None = None
    checkpoint: Checkpoint | None = None  # held while preempted
    run: int = 0  # bumped per dispatch: events of an older run are stale
    preemptions: int = 0
    retries: int = 0  # runs failed by a worker and started again elsewhere
    migrations: int = 0  # runs failed part-way by a worker and continued elsewhere
    unsent: int = 0  # runs that never reached their worker (no connection), tried again uncounted
    first_start_s: float = math.nan
    first_token_s: float = math.nan  # when its answer began (a first chunk, maybe a role alone)
    token_timed: bool = False  # its time to the first token was counted
    queue_s: float = 0.0  # time spent queued, over every visit
    enqueued_s: float = math.nan
    alerted: bool = False
    tokens: int = 0
    resume: ResumeMethod = ResumeMethod.CHECKPOINT  # how a preemption resumes it (laneway.resume)
    reported: int = 0  # tokens at the last progress report to the scheduler
    deltas: bool = True  # whether the reader wants each Delta (else only the end)
    size: int = 0  # bytes of the client's request (Runtime.held_bytes)
    span: Any = None  # its trace span, where traces are on (laneway.tracing)
    _items: deque[Item] = field(default_factory=deque)
    _waiter: asyncio.Future[None] | None = None

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def ended(self) -> bool:
        return self.phase is Phase.ENDED

    def put(self, item: Item) -> None:
        if not self.deltas and type(item) is Delta:
            return
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    @property
    def pending(self) -> bool:
        """Whether :meth:`next` has an item (or the error) at hand, without waiting."""
        return bool(self._items)

    async def next(self) -> Delta | Done:
        """The next item: text, or the ``Done``; raises the error that ended it."""
        items = self._items
        while not items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        item = items.popleft()
        if isinstance(item, RequestError):
            raise item
        return item

    async def events(self) -> AsyncIterator[Delta | Done]:
        """Text as it comes, then the ``Done``; raises the error that ended it."""
        while True:
            item = await self.next()
            yield item
            if type(item) is Done:
                return

    async def result(self) -> Done:
        async for item in self.events():
            if isinstance(item, Done):
                return item
        raise AssertionError("a ticket's events end with Done")  # pragma: no cover


@dataclass(slots=True)
class ClassCounts:
    """The requests a server took, per class: queued, running (or stopping), and the
    longest a queued one has waited."""

    queued: dict[str, int] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)
    oldest_s: dict[str, float] = field(default_factory=dict)


def count_by_class(tickets: Iterable[Ticket], now: float) -> ClassCounts:
    """:class:`ClassCounts` of ``tickets`` at ``now`` (in a cluster, a replica's own: a sum
    over the replicas is the cluster's)."""
    out = ClassCounts()
    for t in tickets:
        name = t.class_name
        if t.phase is Phase.QUEUED:
            out.queued[name] = out.queued.get(name, 0) + 1
            waited = t.queue_s + now - t.enqueued_s
            if waited > out.oldest_s.get(name, 0.0):
                out.oldest_s[name] = waited
        elif t.phase in (Phase.RUNNING, Phase.STOPPING) and t.worker is not None:
            out.running[name] = out.running.get(name, 0) + 1
    return out
