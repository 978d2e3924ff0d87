"""The in-process engine as a worker (the embedded default)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from laneway.backends.base import Capacity, Health, Sink
from laneway.engine.engine import DEFAULT_SPILL_BUDGET, Engine
from laneway.engine.models import LoadedModel, load_model
from laneway.engine.runner import EngineRunner
from laneway.errors import BackendError
from laneway.generation import Checkpoint, Event, Job

# after a preemption, how long the engine thread waits for the request that
# takes the freed slot (a round trip through the event loop) before stepping on
HOLD_AFTER_PREEMPT_S = 0.005


class LocalWorker:
    """Runs a :class:`~laneway.engine.engine.Engine` on a thread; events come back on the loop."""

    def __init__(self, name: str, engine: Engine) -> None:
        self.name = name
        self.engine = engine
        self.model = engine.model.name
        self._runner = EngineRunner(engine, name)
        self._taken = threading.Event()  # set when a request was sent to the engine

    @classmethod
    async def create(
        cls,
        name: str,
        model: str | LoadedModel = "builtin:tiny",
        slots: int = 4,
        *,
        device: str | None = None,
        data_dir: Path | None = None,
        spill_budget_bytes: int = DEFAULT_SPILL_BUDGET,
    ) -> LocalWorker:
        """Load ``model`` (off the event loop) and start the engine thread."""
        loaded = (
            model if isinstance(model, LoadedModel) else await asyncio.to_thread(load_model, model, device)
        )
        engine = Engine(loaded, slots, data_dir=data_dir, spill_budget_bytes=spill_budget_bytes)
        return cls(name, engine)

    def capacity(self) -> Capacity:
        return Capacity(self.engine.slots, self.engine.busy, (self.model,))

    def _on_loop(self, sink: Sink) -> Sink:
        loop = asyncio.get_running_loop()

        def deliver(event: Event) -> None:
            loop.call_soon_threadsafe(sink, event)

        return deliver

    async def run(self, job: Job, sink: Sink) -> None:
        self._check_alive()
        ids = self.engine.prompt_ids(job)  # raises ContextTooLong before a slot is taken
        started = self._runner.add(job, self._on_loop(sink), ids)
        self._taken.set()
        await asyncio.wrap_future(started)

    async def resume(self, checkpoint: Checkpoint, sink: Sink) -> None:
        self._check_alive()
        started = self._runner.resume(checkpoint, self._on_loop(sink))
        self._taken.set()
        await asyncio.wrap_future(started)

    async def preempt(self, job_id: str, mode: str) -> None:
        await asyncio.wrap_future(self._runner.call(lambda: self._stop(job_id, mode)))

    def _stop(self, job_id: str, mode: str) -> Checkpoint | None:
        """On the engine thread: preempt ``job_id``, then hold the next step a
        moment for the request the scheduler gives the slot to (it preempted
        for one), so that it joins that step instead of the one after."""
        self._taken.clear()
        ckpt = self.engine.preempt(job_id, mode)
        if ckpt is not None:
            self._taken.wait(HOLD_AFTER_PREEMPT_S)
        return ckpt

    async def cancel(self, job_id: str) -> None:
        await asyncio.wrap_future(self._runner.cancel(job_id))

    def discard(self, checkpoint: Checkpoint) -> None:
        self._runner.call(lambda: self.engine.discard(checkpoint))

    async def health(self) -> Health:
        if not self._runner.alive:
            return Health(False, f"engine stopped: {self._runner.error}")
        stats = self.engine.stats
        return Health(
            True,
            f"{self.model}: {self.engine.busy}/{self.engine.slots} slots busy, "
            f"{stats.tokens} tokens made at {stats.tokens_per_s:.0f} tokens/s while busy",
        )

    async def close(self) -> None:
        await asyncio.to_thread(self._runner.close)

    def _check_alive(self) -> None:
        if not self._runner.alive:
            raise BackendError(f"worker {self.name} is down: {self._runner.error}")
