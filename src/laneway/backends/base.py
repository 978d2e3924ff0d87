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

from laneway.generation import Checkpoint, Delta, Event, Job, ResumeMethod

Sink = Callable[[Event], None]


@dataclass(frozen=True, slots=True)
class Capacity:
    slots: int
    busy: int
    models: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class EngineState:
    """How loaded an engine is by its own ``/metrics`` (every client's requests):
    running, waiting in its own queue, and the share of its KV cache in use; and its
    prefix cache's counters since it started: prompt tokens looked up, tokens found
    (``None``: not said)."""

    running: int
    waiting: int
    kv_usage: float | None = None
    prefix_queries: float | None = None
    prefix_hits: float | None = None


@dataclass(frozen=True, slots=True)
class Health:
    """``transient``: a failure that may pass by itself (a probe that timed out), as opposed
    to one that says the worker cannot serve (refused, the wrong model, an engine that died)."""

    ok: bool
    detail: str = ""
    transient: bool = False


@runtime_checkable
class Worker(Protocol):
    """What every worker is and can do. Beside running jobs, what the runtime asks of it:

    - ``features``: the optional request features it implements
      (:data:`laneway.protocol.fields.FEATURES`), or ``"passthrough"``: it forwards every
      field to the engine it fronts;
    - ``engine_name``: its engine in words, for messages ("the built-in engine");
    - ``can_checkpoint``: a preempted job resumes from a saved state (else it is computed
      again): the scheduler's choice of preemption mode counts on it;
    - ``max_model_len``: the context it serves (``None``: not known), listed in ``/v1/models``;
    - ``engine``: the in-process engine it runs (whose costs are measured at start), or ``None``;
    - :meth:`resume_method`, :meth:`engine_load`, :meth:`engine_state`, :meth:`capabilities`,
      :meth:`admit`.
    """

    name: str

    @property
    def features(self) -> frozenset[str]: ...

    @property
    def engine_name(self) -> str: ...

    @property
    def can_checkpoint(self) -> bool: ...

    @property
    def max_model_len(self) -> int | None: ...

    @property
    def engine(self) -> object | None: ...

    def capacity(self) -> Capacity: ...

    def resume_method(self, job: Job) -> ResumeMethod:
        """How a preemption of ``job`` would resume here (a response's ``laneway.resume``)."""
        ...

    async def engine_load(self) -> int | None:
        """The requests its engine runs or queues, by the engine's own count (every client's);
        ``None`` where it gives none."""
        ...

    async def engine_state(self) -> EngineState | None:
        """Its engine's load by the engine's own ``/metrics``; ``None`` where it gives none."""
        ...

    def capabilities(self) -> dict[str, object] | None:
        """What was learnt of the engine it fronts (``/readyz``); ``None``: nothing to learn."""
        ...

    def admit(self, job: Job) -> None:
        """Raise the :class:`~laneway.errors.RequestError` of a ``job`` it could never run,
        whatever the wait (a prompt past the model's context): refused as it arrives, not
        after it queued. Nothing where only the engine knows."""
        ...

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
