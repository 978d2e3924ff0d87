"""The upstream worker against the stand-in engine in this very process (its HTTP client
connected to the engine's app through in-memory transports: :mod:`laneway.backends.inprocess`),
so its logic is tested at many more points than a real process allows in the time: a
request answered whole or streamed, a cancel or a preemption at any turn of the event loop
ending the request at the engine every time, the preempted one resumed making exactly its
tokens. (The same against a real stand-in process, over sockets: test_upstream_cancel.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from laneway.backends.inprocess import InProcess
from laneway.backends.upstream import UpstreamWorker
from laneway.generation import Delta, Done, Event, Job, SamplingParams, Stopped
from laneway.standin import StandIn

POINTS = range(0, 40)  # a stop after this many turns of the event loop (0: at once)
LONG = 400  # tokens of a request stopped part-way (1 ms each: it would run on)
RESUMED = 30


def make_job(kind: str, job_id: str, max_tokens: int, *, stream: bool = False) -> Job:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    if kind == "chat":
        return Job(
            id=job_id,
            model="standin",
            messages=({"role": "user", "content": "go on"},),
            params=params,
            stream=stream,
        )
    return Job(id=job_id, model="standin", prompt="go on", params=params, stream=stream)


def worker_on(engine: StandIn) -> UpstreamWorker:
    return UpstreamWorker("up", "http://standin.invalid/v1", "standin", slots=8, connect=InProcess(engine))


async def until(check: Callable[[], bool], turns: int = 20_000) -> None:
    for _ in range(turns):
        if check():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("not in time")


async def ended(events: list[Event]) -> Event:
    """The last event of a run, once it came (its end: anything but a Delta)."""
    await until(lambda: bool(events) and not isinstance(events[-1], Delta))
    return events[-1]


async def run_whole(worker: UpstreamWorker, job: Job) -> Done:
    events: list[Event] = []
    await worker.run(job, events.append)
    last = await ended(events)
    assert isinstance(last, Done), last
    return last


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_an_in_process_engine_answers_as_the_real_one(kind: str, stream: bool) -> None:
    async def main() -> tuple[Done, Done]:
        engine = StandIn(slots=4, ms_per_token=0)
        worker = worker_on(engine)
        try:
            first = await run_whole(worker, make_job(kind, "a", 12, stream=stream))
            again = await run_whole(worker, make_job(kind, "b", 12, stream=stream))  # (a kept connection)
        finally:
            await worker.close()
        assert engine.served == 2 and engine.open_requests() == 0
        return first, again

    first, again = asyncio.run(main())
    assert first.usage.completion_tokens == 12 and first.text and first.text == again.text


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_a_cancel_at_any_turn_ends_the_request_at_the_engine(kind: str) -> None:
    async def main() -> list[str]:
        lost: list[str] = []
        engine = StandIn(slots=64, ms_per_token=1)
        worker = worker_on(engine)
        try:
            for turns in POINTS:
                events: list[Event] = []
                job = make_job(kind, f"c{turns}", LONG)
                await worker.run(job, events.append)
                for _ in range(turns):
                    await asyncio.sleep(0)
                await worker.cancel(job.id)
                ended = len(events)
                for _ in range(8):  # the close reaches the engine within a few turns
                    await asyncio.sleep(0)
                if engine.open_requests():
                    lost.append(f"turns={turns}: the engine still had {engine.open_requests()} open")
                if len(events) != ended or not events or not isinstance(events[-1], Done):
                    lost.append(f"turns={turns}: events after the cancel, or no Done")
                if worker.capacity().busy:
                    lost.append(f"turns={turns}: its slot is still taken")
        finally:
            await worker.close()
        return lost

    assert asyncio.run(main()) == []


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_a_preemption_at_any_turn_resumes_to_exactly_its_tokens(kind: str) -> None:
    async def main() -> list[str]:
        lost: list[str] = []
        engine = StandIn(slots=64, ms_per_token=1)
        worker = worker_on(engine)
        try:
            expected = await run_whole(worker, make_job(kind, "ref", RESUMED))
            for turns in POINTS:
                events: list[Event] = []
                job = make_job(kind, f"p{turns}", RESUMED)
                await worker.run(job, events.append)
                for _ in range(turns):
                    await asyncio.sleep(0)
                await worker.preempt(job.id, "checkpoint")
                last = await ended(events)
                if isinstance(last, Stopped):
                    for _ in range(8):
                        await asyncio.sleep(0)
                    if engine.open_requests():
                        lost.append(f"turns={turns}: the preempted request is still open at the engine")
                    resumed: list[Event] = []
                    await worker.resume(last.checkpoint, resumed.append)
                    last = await ended(resumed)
                if not isinstance(last, Done):
                    lost.append(f"turns={turns}: ended with {type(last).__name__}")
                elif last.usage.completion_tokens != RESUMED or last.text != expected.text:
                    lost.append(
                        f"turns={turns}: {last.usage.completion_tokens} tokens, text as one run: "
                        f"{last.text == expected.text}"
                    )
        finally:
            await worker.close()
        assert engine.open_requests() == 0
        return lost

    assert asyncio.run(main()) == []


def test_closing_the_worker_closes_its_connections_at_the_engine() -> None:
    async def main() -> int:
        engine = StandIn(slots=4, ms_per_token=5)
        worker = worker_on(engine)
        events: list[Event] = []
        await worker.run(make_job("completion", "x", LONG, stream=True), events.append)
        await until(lambda: engine.open_requests() == 1)
        await worker.close()
        for _ in range(8):
            await asyncio.sleep(0)
        return engine.open_requests()

    assert asyncio.run(main()) == 0
