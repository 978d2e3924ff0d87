"""The in-process engine as a worker (the embedded default).

A job asking for ``n > 1`` choices runs as ``n`` engine sequences (choice
``i`` of a seeded request samples with ``seed + i``), reported as one job:
its deltas carry their choice's index, it ends when every choice has, and a
preemption checkpoints every choice still running.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path

from laneway.backends.base import Capacity, EngineState, Health, Sink
from laneway.engine.engine import DEFAULT_SPILL_BUDGET, Engine
from laneway.engine.models import LoadedModel, load_model
from laneway.engine.runner import EngineRunner
from laneway.errors import BackendError, InvalidRequest
from laneway.generation import (
    MAX_CHOICES,
    SEED_RANGE,
    Checkpoint,
    Delta,
    Done,
    Ending,
    Event,
    Failed,
    Job,
    ResumeMethod,
    Stopped,
    Usage,
)

# after a preemption, how long the engine thread waits for the request that
# takes the freed slot (a round trip through the event loop) before stepping on
HOLD_AFTER_PREEMPT_S = 0.005
# what the engine's sampler implements (laneway.protocol.fields.FEATURES)
ENGINE_FEATURES = frozenset(
    {
        "n",
        "logprobs",
        "penalties",
        "top_k",
        "min_p",
        "logit_bias",
        "min_tokens",
        "stop_token_ids",
        "token_ids",
    }
)

log = logging.getLogger("laneway.backends")


def choice_seed(seed: int | None, index: int) -> int | None:
    if seed is None:
        return None
    low, high = SEED_RANGE
    return (seed + index - low) % (high - low + 1) + low


@dataclass(eq=False)
class _Choices:
    """The engine sequences of one job with ``n > 1``."""

    job: Job
    sink: Sink
    live: dict[int, str] = field(default_factory=dict)  # index -> engine job id, while running
    endings: dict[int, Ending] = field(default_factory=dict)
    stopped: dict[int, Checkpoint] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    prompt_ids: tuple[int, ...] | None = None
    failed: bool = False

    def sub_job(self, index: int) -> Job:
        p = self.job.params
        params = replace(p, n=1, seed=choice_seed(p.seed, index))
        return replace(self.job, id=f"{self.job.id}#{index}", params=params)

    def on_event(self, index: int, event: Event) -> Event | None:
        """The job's event for choice ``index``'s engine event, once there is one."""
        job_id = self.job.id
        if isinstance(event, Delta):
            self.tokens[index] = event.tokens
            made = sum(self.tokens.values())
            return Delta(
                job_id, event.text, made, index, event.logprobs, None, event.token_ids, event.prompt_ids
            )
        self.live.pop(index, None)
        if isinstance(event, Failed):
            if self.failed:
                return None
            self.failed = True
            return Failed(job_id, event.error)
        if isinstance(event, Done):
            self.prompt_tokens = event.usage.prompt_tokens
            self.prompt_ids = event.prompt_ids
            self.tokens[index] = event.usage.completion_tokens
            first = event.choices[0] if event.choices else Ending(0, event.text, event.finish_reason)
            self.endings[index] = replace(first, index=index)
        elif isinstance(event, Stopped):
            self.stopped[index] = event.checkpoint
        if self.live or self.failed:
            return None
        return self._stopped() if self.stopped else self._done()

    def _done(self) -> Done:
        endings = tuple(self.endings[i] for i in sorted(self.endings))
        usage = Usage(self.prompt_tokens, sum(self.tokens.values()))
        first = endings[0]
        return Done(
            self.job.id, first.finish_reason, usage, first.text, choices=endings, prompt_ids=self.prompt_ids
        )

    def _stopped(self) -> Stopped:
        parts = self.stopped
        self.stopped = {}
        nbytes = sum(c.nbytes for c in parts.values())
        save_s = max(c.save_s for c in parts.values())
        text = parts[0].text_so_far if 0 in parts else self.endings[0].text
        mode = next(iter(parts.values())).mode
        ckpt = Checkpoint(self.job, mode, sum(self.tokens.values()), text, nbytes, save_s, (self, parts))
        return Stopped(self.job.id, ckpt)


class LocalWorker:
    """Runs a :class:`~laneway.engine.engine.Engine` on a thread; events come back on the loop."""

    features = ENGINE_FEATURES
    engine_name = "the built-in engine"
    can_checkpoint = True  # (the KV cache is saved and restored: exact)

    def resume_method(self, job: Job) -> ResumeMethod:
        return ResumeMethod.CHECKPOINT

    async def engine_load(self) -> int | None:
        return None  # (the scheduler counts what runs on it: nothing else does)

    async def engine_state(self) -> EngineState | None:
        return None

    def capabilities(self) -> dict[str, object] | None:
        return None

    def admit(self, job: Job) -> None:
        ids = self.engine.prompt_ids(job)  # (its context, the token ids it names: the model's)
        n = job.params.n or 1
        if n > 1:  # (its choices are n sequences of the engine, on one slot of the scheduler's)
            context = self.engine.model.context
            each = min(len(ids) + (job.params.max_tokens or context), context)
            if n * each > self.slots * context:  # (more KV than all its slots at full context)
                raise InvalidRequest(
                    f"n = {n} choices of up to {each:,} tokens each ({n * each:,} in all) are more than "
                    f"this engine holds at once ({self.slots} slots of {context:,} tokens): ask fewer "
                    "choices or a lower max_tokens",
                    param="n",
                )

    def __init__(self, name: str, engine: Engine, slots: int | None = None) -> None:
        self.name = name
        self.engine = engine
        self.slots = slots or engine.slots
        self.model = engine.model.name
        self.max_model_len: int | None = engine.model.context  # (listed in /v1/models)
        self._runner = EngineRunner(engine, name)
        self._closing = False
        self._taken = threading.Event()  # set when a request was sent to the engine
        self._live: dict[str, _Choices | None] = {}  # jobs here (with their choices where n > 1)

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
        # room for every choice of every job: the worker, not the engine, counts jobs against slots
        engine = Engine(loaded, slots * MAX_CHOICES, data_dir=data_dir, spill_budget_bytes=spill_budget_bytes)
        return cls(name, engine, slots)

    def capacity(self) -> Capacity:
        return Capacity(self.slots, len(self._live), (self.model,))

    def _deliver(self, sink: Sink, job_id: str, choices: _Choices | None, index: int) -> Sink:
        """A sink for the engine thread: the event is handed to ``sink`` on this loop."""
        loop = asyncio.get_running_loop()

        def on_loop(event: Event) -> None:
            if choices is not None:
                out = choices.on_event(index, event)
                if out is None:
                    return
                event = out
            if not isinstance(event, Delta) and self._live.get(job_id, False) is choices:
                del self._live[job_id]
            sink(event)

        def deliver(event: Event) -> None:
            loop.call_soon_threadsafe(on_loop, event)

        return deliver

    def _claim(self, job_id: str, choices: _Choices | None) -> None:
        if job_id in self._live:
            raise BackendError(f"job {job_id!r} is already running on worker {self.name}")
        if len(self._live) >= self.slots:
            raise BackendError(f"all {self.slots} slots of worker {self.name} are busy")
        self._live[job_id] = choices

    async def run(self, job: Job, sink: Sink) -> None:
        self._check_alive()
        ids = self.engine.prompt_ids(job)  # raises ContextTooLong before a slot is taken
        if job.params.n == 1:
            self._claim(job.id, None)
            started = [self._runner.add(job, self._deliver(sink, job.id, None, 0), ids)]
        else:
            group = _Choices(job, sink)
            self._claim(job.id, group)
            started = []
            for i in range(job.params.n):
                sub = group.sub_job(i)
                group.live[i] = sub.id
                started.append(self._runner.add(sub, self._deliver(sink, job.id, group, i), ids))
        self._taken.set()
        await self._started(job.id, started)

    async def resume(self, checkpoint: Checkpoint, sink: Sink) -> None:
        self._check_alive()
        job = checkpoint.job
        state = checkpoint.state
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], _Choices):
            group, parts = state
            group.sink = sink
            self._claim(job.id, group)
            started = []
            for i, ckpt in parts.items():
                group.live[i] = ckpt.job.id
                started.append(self._runner.resume(ckpt, self._deliver(sink, job.id, group, i)))
        else:
            self._claim(job.id, None)
            started = [self._runner.resume(checkpoint, self._deliver(sink, job.id, None, 0))]
        self._taken.set()
        await self._started(job.id, started)

    async def _started(self, job_id: str, started: Sequence[Future[None]]) -> None:
        try:
            for fut in started:
                await asyncio.wrap_future(fut)
        except BaseException:
            self._live.pop(job_id, None)
            raise

    def _engine_ids(self, job_id: str) -> list[str]:
        group = self._live.get(job_id)
        return list(group.live.values()) if group is not None else [job_id]

    async def preempt(self, job_id: str, mode: str) -> None:
        ids = self._engine_ids(job_id)
        await asyncio.wrap_future(self._runner.call(lambda: self._stop(ids, mode)))

    def _stop(self, ids: list[str], mode: str) -> None:
        """On the engine thread: preempt ``ids``, then hold the next step a
        moment for the request the scheduler gives the slot to (it preempted
        for one), so that it joins that step instead of the one after."""
        self._taken.clear()
        stopped = [self.engine.preempt(i, mode) for i in ids]
        if any(c is not None for c in stopped):
            self._taken.wait(HOLD_AFTER_PREEMPT_S)

    async def cancel(self, job_id: str) -> None:
        ids = self._engine_ids(job_id)
        # its slot is free from now (the scheduler counts it so): the engine, which has
        # room for every choice of every slot, ends it before the next job it is given
        self._live.pop(job_id, None)
        for engine_id in ids:
            await asyncio.wrap_future(self._runner.cancel(engine_id))

    def discard(self, checkpoint: Checkpoint) -> None:
        state = checkpoint.state
        parts = list(state[1].values()) if isinstance(state, tuple) else [checkpoint]
        for ckpt in parts:
            self._runner.call(functools.partial(self.engine.discard, ckpt))

    async def health(self) -> Health:
        if not self._runner.alive:
            # the engine stopped after failing step after step: start it again (its jobs
            # have all failed); the next probe says whether it works now
            error = self._runner.error
            if not self._closing:
                self._live.clear()
                self._runner = EngineRunner(self.engine, self.name)
                log.warning("worker %s: the engine stopped (%s); started again", self.name, error)
            return Health(False, f"engine stopped: {error}")
        stats = self.engine.stats
        return Health(
            True,
            f"{self.model}: {len(self._live)}/{self.slots} slots busy, "
            f"{stats.tokens} tokens made at {stats.tokens_per_s:.0f} tokens/s while busy",
        )

    async def close(self) -> None:
        self._closing = True
        await asyncio.to_thread(self._runner.close)

    def _check_alive(self) -> None:
        if not self._runner.alive:
            raise BackendError(f"worker {self.name} is down: {self._runner.error}")
