"""Helpers for the engine tests: collecting events, running to idle, reference runs."""

from __future__ import annotations

from collections.abc import Callable

from laneway.engine.engine import Engine
from laneway.generation import Checkpoint, Delta, Done, Event, Job, SamplingParams, Stopped


class Collector:
    """Every event per job, in order."""

    def __init__(self) -> None:
        self.events: dict[str, list[Event]] = {}

    def sink(self, job_id: str) -> Callable[[Event], None]:
        return self.events.setdefault(job_id, []).append

    def done(self, job_id: str) -> Done:
        last = self.events[job_id][-1]
        assert isinstance(last, Done), last
        return last

    def streamed(self, job_id: str) -> str:
        return "".join(e.text for e in self.events[job_id] if isinstance(e, Delta))

    def checkpoint(self, job_id: str) -> Checkpoint:
        stops = [e for e in self.events[job_id] if isinstance(e, Stopped)]
        return stops[-1].checkpoint


def run_all(engine: Engine, col: Collector, max_steps: int = 10_000) -> int:
    """Step until the engine is idle; the number of steps."""
    for n in range(max_steps):
        if not engine.has_work:
            return n
        engine.step()
    raise AssertionError("engine did not go idle")


def greedy(max_tokens: int = 24, **kw: object) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)  # type: ignore[arg-type]


def job(job_id: str, prompt: str = "hello world", params: SamplingParams | None = None) -> Job:
    return Job(job_id, "builtin:tiny", params or greedy(), prompt=prompt)


def alone(engine: Engine, j: Job) -> Done:
    """``j`` run uninterrupted, alone in the engine."""
    col = Collector()
    engine.add(j, col.sink(j.id))
    run_all(engine, col)
    return col.done(j.id)
