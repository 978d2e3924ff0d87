"""A simulated worker: text at a set pace, no model (load tests, gateway tests).

It implements the :class:`~laneway.backends.base.Worker` protocol with the
same observable behaviour as a real engine: a fixed number of slots, one
``Delta`` per token, ``Done`` with usage, preemption at a token boundary with a
``Stopped`` event whose checkpoint resumes exactly where it stopped, and
cancellation. The text is a deterministic function of the prompt, so a job
preempted and resumed writes what it would have written in one go.

``stop`` strings end the text just before the first of them (a tail that could begin one
is held back meanwhile). ``tokens_per_s=None`` produces tokens as fast as the event loop allows;
``output_tokens`` fixes the length (else ``max_tokens``); ``stop_after`` ends
a job with ``finish_reason="stop"`` after that many tokens when ``max_tokens``
allows them.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass

from laneway.backends.base import Capacity, EngineState, Health, Sink
from laneway.errors import BackendError, InvalidRequest
from laneway.generation import Checkpoint, Delta, Done, Job, ResumeMethod, Stopped, Usage

WORDS = (
    "the", "lane", "way", "queue", "token", "batch", "chat", "slot", "wait", "run",
    "fast", "slow", "class", "fair", "work", "done",
)  # fmt: skip
BYTES_PER_TOKEN = 1024  # what a checkpoint of one token is said to hold


def prompt_text(job: Job) -> str:
    if job.prompt is not None:
        return job.prompt
    return "\n".join(str(m.get("content") or "") for m in job.messages or ())


def word(seed: int, index: int) -> str:
    """The ``index``-th token of a text seeded by ``seed`` (a word and a space)."""
    h = zlib.crc32(index.to_bytes(4, "little"), seed)
    return WORDS[h % len(WORDS)] + " "


@dataclass(eq=False)
class _Run:
    job: Job
    sink: Sink
    seed: int
    prompt_tokens: int
    done: int  # tokens generated so far
    target: int  # tokens it will generate in all
    finish: str  # finish reason once target is reached
    text: str = ""  # what it sent
    raw: str = ""  # what it made (with stop strings: a tail that could begin one is held back)
    task: asyncio.Task[None] | None = None
    stop_mode: str | None = None  # set by preempt


class SimulatedWorker:
    """``slots`` concurrent jobs, each writing ``tokens_per_s`` tokens a second."""

    features: frozenset[str] = frozenset()  # plain text only: no log-probabilities, choices, penalties
    engine_name = "the simulated worker"
    can_checkpoint = True  # (its checkpoint is where it stopped: exact)
    max_model_len: int | None = None
    engine: object | None = None

    def resume_method(self, job: Job) -> ResumeMethod:
        return ResumeMethod.CHECKPOINT

    async def engine_load(self) -> int | None:
        return None  # (it is its own engine: the scheduler counts what runs on it)

    async def engine_state(self) -> EngineState | None:
        return None

    def capabilities(self) -> dict[str, object] | None:
        return None

    def admit(self, job: Job) -> None:
        return None  # (it runs whatever it is given)

    def __init__(
        self,
        name: str,
        model: str = "simulated",
        slots: int = 4,
        *,
        tokens_per_s: float | None = 50.0,
        first_token_s: float = 0.0,
        output_tokens: int | None = None,
        stop_after: int | None = None,
    ) -> None:
        if slots < 1:
            raise ValueError("a simulated worker needs at least one slot")
        if tokens_per_s is not None and tokens_per_s <= 0:
            raise ValueError("tokens_per_s must be > 0 (or None: as fast as possible)")
        self.name = name
        self.model = model
        self.slots = slots
        self.tokens_per_s = tokens_per_s
        self.first_token_s = first_token_s
        self.output_tokens = output_tokens
        self.stop_after = stop_after
        self._runs: dict[str, _Run] = {}
        self._closed = False
        self.started = 0  # jobs started or resumed (tests and load reports read it)

    def capacity(self) -> Capacity:
        return Capacity(self.slots, len(self._runs), (self.model,))

    async def run(self, job: Job, sink: Sink) -> None:
        self._check_free(job.id)
        text = prompt_text(job)
        limit = job.params.max_tokens or 16
        target = limit if self.output_tokens is None else self.output_tokens
        finish = "length"
        if self.stop_after is not None and self.stop_after < target:
            target, finish = self.stop_after, "stop"
        target = min(target, limit)
        seed = zlib.crc32(text.encode("utf-8"))
        prompt_tokens = max(1, len(text.split()))
        self._start(_Run(job, sink, seed, prompt_tokens, 0, target, finish))

    async def resume(self, checkpoint: Checkpoint, sink: Sink) -> None:
        state = checkpoint.state
        if not isinstance(state, _Run):
            raise BackendError(f"checkpoint of {checkpoint.job.id} was not made by a simulated worker")
        self._check_free(checkpoint.job.id)
        state.sink, state.stop_mode, state.task = sink, None, None
        self._start(state)

    async def preempt(self, job_id: str, mode: str) -> None:
        run = self._runs.get(job_id)
        if run is not None and run.stop_mode is None:
            run.stop_mode = mode
            if run.task is not None:
                run.task.cancel()

    async def cancel(self, job_id: str) -> None:
        run = self._runs.pop(job_id, None)
        if run is None:
            return
        if run.task is not None:
            run.task.cancel()
        run.sink(Done(job_id, "cancelled", Usage(run.prompt_tokens, run.done), run.text))

    def discard(self, checkpoint: Checkpoint) -> None:
        checkpoint.state = None

    async def health(self) -> Health:
        if self._closed:
            return Health(False, "closed")
        return Health(True, f"{self.model}: {len(self._runs)}/{self.slots} slots busy")

    async def close(self) -> None:
        self._closed = True
        for job_id in list(self._runs):
            await self.cancel(job_id)

    # ------------------------------------------------------------------ internals
    def _check_free(self, job_id: str) -> None:
        if self._closed:
            raise BackendError(f"worker {self.name} is closed")
        if job_id in self._runs:
            raise InvalidRequest(f"job {job_id!r} is already running on this worker")
        if len(self._runs) >= self.slots:
            raise BackendError(f"all {self.slots} slots are busy")

    def _start(self, run: _Run) -> None:
        self._runs[run.job.id] = run
        self.started += 1
        run.task = task = asyncio.get_running_loop().create_task(self._generate(run))
        task.add_done_callback(lambda t: self._ended(run, t))

    def _ended(self, run: _Run, task: asyncio.Task[None]) -> None:
        """A preempted job's task was cancelled (maybe before it ever ran): report ``Stopped``."""
        if task.cancelled() and run.stop_mode is not None and self._runs.get(run.job.id) is run:
            self._stopped(run)

    async def _generate(self, run: _Run) -> None:
        step = None if self.tokens_per_s is None else 1.0 / self.tokens_per_s
        if self.first_token_s and run.done == 0:
            await asyncio.sleep(self.first_token_s)
        stops = run.job.params.stop
        hold = max((len(s) for s in stops), default=1) - 1
        while run.done < run.target:
            await asyncio.sleep(step or 0)
            piece = word(run.seed, run.done)
            run.done += 1
            if not stops:
                run.text += piece
                run.sink(Delta(run.job.id, piece, run.done))
                continue
            run.raw += piece
            cut = min(
                (i for s in stops if (i := run.raw.find(s, max(len(run.text) - hold, 0))) >= 0), default=-1
            )
            if cut >= 0:  # (a stop string: the text ends just before it)
                run.raw, run.finish = run.raw[:cut], "stop"
                break
            self._send(run, len(run.raw) - hold)
        if self._runs.pop(run.job.id, None) is run:
            self._send(run, len(run.raw))
            run.sink(Done(run.job.id, run.finish, Usage(run.prompt_tokens, run.done), run.text))

    @staticmethod
    def _send(run: _Run, upto: int) -> None:
        """Send what it made up to ``upto`` characters (with stop strings)."""
        if upto > len(run.text):
            piece = run.raw[len(run.text) : upto]
            run.text += piece
            run.sink(Delta(run.job.id, piece, run.done))

    def _stopped(self, run: _Run) -> None:
        del self._runs[run.job.id]
        mode = ResumeMethod(run.stop_mode or ResumeMethod.CHECKPOINT)
        nbytes = (run.prompt_tokens + run.done) * BYTES_PER_TOKEN if mode is ResumeMethod.CHECKPOINT else 0
        ckpt = Checkpoint(run.job, mode, run.done, run.text, nbytes, 0.0, run)
        run.sink(Stopped(run.job.id, ckpt))
