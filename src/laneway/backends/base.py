"""The worker protocol: how the runtime drives anything that generates text.

A worker has a fixed number of slots and serves some models. ``run`` starts a
job; its events (:mod:`laneway.generation`: ``Delta``\\* then one of ``Done``,
``Stopped``, ``Failed``) arrive through the ``sink`` callback on the caller's
event loop. ``preempt`` stops a job at a token boundary: its ``Stopped`` event
carries the :class:`~laneway.generation.Checkpoint` that ``resume`` takes.
``stream`` wraps ``run`` as an async iterator.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from laneway.generation import Checkpoint, Delta, Event, Job

Sink = Callable[[Event], None]


@dataclass(frozen=True, slots=True)
class Capacity:
    slots: int
    busy: int
    models: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Health:
    """``transient``: a failure that may pass by itself (a probe that timed out), as opposed
    to one that says the worker cannot serve (refused, the wrong model, an engine that died)."""

    ok: bool
    detail: str = ""
    transient: bool = False


@runtime_checkable
class Worker(Protocol):
    name: str
    # optional request features it implements (laneway.protocol.fields.FEATURES), or
    # "passthrough": it forwards every field to the engine it fronts
    features: frozenset[str]

    def capacity(self) -> Capacity: ...

    async def run(self, job: Job, sink: Sink) -> None:
        """Start ``job``; raise a :class:`~laneway.errors.RequestError` if it cannot run as asked."""

    async def resume(self, checkpoint: Checkpoint, sink: Sink) -> None:
        """Continue a job from the checkpoint of its ``Stopped`` event."""

    async def preempt(self, job_id: str, mode: str) -> None:
        """Stop ``job_id`` at the next token boundary; its sink gets ``Stopped``. No-op if it ended."""

    async def cancel(self, job_id: str) -> None:
        """End ``job_id`` now (its sink gets ``Done`` with ``finish_reason="cancelled"``)."""

    def discard(self, checkpoint: Checkpoint) -> None:
        """Free what a checkpoint holds when its job will not resume."""

    async def health(self) -> Health: ...

    async def close(self) -> None: ...


async def stream(worker: Worker, job: Job) -> AsyncIterator[Event]:
    """Run ``job`` on ``worker`` and yield its events until the last one."""
    events: asyncio.Queue[Event] = asyncio.Queue()
    await worker.run(job, events.put_nowait)
    while True:
        event = await events.get()
        yield event
        if not isinstance(event, Delta):
            return
