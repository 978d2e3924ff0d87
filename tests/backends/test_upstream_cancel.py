"""A cancel or a preemption is never lost: stopped at any point of its life (before its
connection is made, while it connects, before the answer's head, mid-stream, at its last
chunk), an upstream request is ended at the upstream every time, nothing of it reaches
the job after its end, and a preempted job resumed afterwards makes exactly its tokens.

The stand-in engine counts the requests it has open (``/stats``: ``open``); a request
that was not ended there would run to its end (seconds here) on a slot the scheduler
has given to someone else."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from laneway.backends.upstream import UpstreamWorker
from laneway.generation import Delta, Done, Event, Failed, Job, SamplingParams, Stopped
from laneway.testing import StandInProcess

MAX_TOKENS = 1500  # 3 s at 2 ms a token: far past the time a stopped request may stay open
RESUMED_TOKENS = 40
SETTLE_S = 1.0  # an ended request leaves the stand-in within this
# where a stop lands: after this many turns of the event loop (0: at once, the request not
# even connected), or after this many seconds (the answer streaming)
TURNS = tuple(range(0, 9))
DELAYS_S = (0.002, 0.01, 0.03)


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInProcess]:
    log = tmp_path_factory.mktemp("standin") / "standin.log"
    engine = StandInProcess(log, ("--slots", "64", "--ms-per-token", "2"))
    try:
        yield engine
    finally:
        engine.stop()


async def open_requests(client: httpx.AsyncClient, standin: StandInProcess) -> int:
    stats = (await client.get(standin.url.removesuffix("/v1") + "/stats")).json()
    return int(stats["open"])


async def settled(client: httpx.AsyncClient, standin: StandInProcess) -> int:
    """The requests still open at the stand-in once a stopped one has had time to leave."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        n = await open_requests(client, standin)
        if n == 0 or time.monotonic() > deadline:
            return n
        await asyncio.sleep(0.02)


async def stop_point(turns: int | None, delay_s: float | None) -> None:
    if delay_s is not None:
        await asyncio.sleep(delay_s)
    for _ in range(turns or 0):
        await asyncio.sleep(0)


POINTS = [(t, None) for t in TURNS] + [(None, d) for d in DELAYS_S]


@pytest.mark.parametrize("warm", [False, True], ids=["new-connection", "kept-connection"])
@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_a_cancel_at_any_point_ends_the_upstream_request(
    standin: StandInProcess, warm: bool, kind: str
) -> None:
    async def main() -> list[str]:
        lost: list[str] = []
        async with httpx.AsyncClient(timeout=10) as client:
            worker = UpstreamWorker("up", standin.url, "standin", slots=4, token_ids="vllm")
            try:
                for i, (turns, delay) in enumerate(POINTS):
                    if not warm:  # each request on a connection of its own, made after run()
                        await worker.close()
                        worker = UpstreamWorker("up", standin.url, "standin", slots=4, token_ids="vllm")
                    events: list[Event] = []
                    job = make_job(kind, f"c{i}", MAX_TOKENS)
                    await worker.run(job, events.append)
                    await stop_point(turns, delay)
                    await worker.cancel(job.id)
                    ended = len(events)
                    left = await settled(client, standin)
                    where = f"turns={turns} delay={delay}"
                    if left:
                        lost.append(f"{where}: the upstream still had {left} open")
                    if len(events) != ended:
                        lost.append(f"{where}: {len(events) - ended} events after the cancel")
                    if not events or not isinstance(events[ended - 1], Done):
                        lost.append(f"{where}: its last event was not Done")
                    assert worker.capacity().busy == 0
            finally:
                await worker.close()
        return lost

    assert asyncio.run(main()) == []


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_a_preemption_at_any_point_ends_the_run_and_the_resumed_run_makes_its_tokens(
    standin: StandInProcess, kind: str
) -> None:
    async def main() -> list[str]:
        lost: list[str] = []
        async with httpx.AsyncClient(timeout=10) as client:
            whole = make_job(kind, "ref", RESUMED_TOKENS)
            ref = UpstreamWorker("ref", standin.url, "standin", slots=4, token_ids="vllm")
            ref_events: list[Event] = []
            await ref.run(whole, ref_events.append)
            while not ref_events or isinstance(ref_events[-1], Delta):
                await asyncio.sleep(0.01)
            await ref.close()
            expected = ref_events[-1]
            assert isinstance(expected, Done)
            for i, (turns, delay) in enumerate(POINTS):
                worker = UpstreamWorker("up", standin.url, "standin", slots=4, token_ids="vllm")
                try:
                    events: list[Event] = []
                    job = make_job(kind, f"p{i}", RESUMED_TOKENS)
                    await worker.run(job, events.append)
                    await stop_point(turns, delay)
                    await worker.preempt(job.id, "checkpoint")
                    where = f"turns={turns} delay={delay}"
                    if not events or isinstance(events[-1], Delta):
                        lost.append(f"{where}: no end after the preemption")
                        continue
                    last = events[-1]
                    if isinstance(last, Stopped):
                        if await settled(client, standin):
                            lost.append(f"{where}: the preempted request is still open upstream")
                        resumed: list[Event] = []
                        await worker.resume(last.checkpoint, resumed.append)
                        deadline = time.monotonic() + 10
                        while (not resumed or isinstance(resumed[-1], Delta)) and time.monotonic() < deadline:
                            await asyncio.sleep(0.01)
                        last = resumed[-1] if resumed else last
                    if not isinstance(last, Done):
                        lost.append(f"{where}: ended with {type(last).__name__}")
                        continue
                    if last.usage.completion_tokens != RESUMED_TOKENS:
                        lost.append(f"{where}: usage {last.usage.completion_tokens} of {RESUMED_TOKENS}")
                    if last.text != expected.text:
                        lost.append(f"{where}: the text differs from one uninterrupted run")
                finally:
                    await worker.close()
                if await settled(client, standin):
                    lost.append(f"{where}: a request was left open upstream")
        return lost

    assert asyncio.run(main()) == []


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_a_worker_closed_under_a_run_ends_it_retryable_from_where_it_stopped(
    standin: StandInProcess, kind: str
) -> None:
    """A worker closed with a run on it (a fleet's worker removed while a dispatch to it raced
    the removal) ends the run failed, retryable, with what it made to go on from elsewhere:
    before, the run was dropped without an end and its client waited for ever."""

    async def main() -> list[str]:
        lost: list[str] = []
        async with httpx.AsyncClient(timeout=10) as client:
            expected = await one_run(kind, standin, RESUMED_TOKENS)
            for i, (turns, delay) in enumerate(POINTS):
                worker = UpstreamWorker("up", standin.url, "standin", slots=4, token_ids="vllm")
                events: list[Event] = []
                job = make_job(kind, f"x{i}", RESUMED_TOKENS)
                await worker.run(job, events.append)
                await stop_point(turns, delay)
                await worker.close()
                where = f"turns={turns} delay={delay}"
                ended = len(events)
                await asyncio.sleep(0.05)
                last = events[-1] if events else None
                if not isinstance(last, Failed) or not getattr(last.error, "retryable", False):
                    lost.append(f"{where}: it ended with {last!r}, not a retryable failure")
                    continue
                if len(events) != ended:
                    lost.append(f"{where}: {len(events) - ended} events after its end")
                if await settled(client, standin):
                    lost.append(f"{where}: the request is still open upstream")
                made = max((e.tokens for e in events if isinstance(e, Delta)), default=0)
                checkpoint = getattr(last.error, "checkpoint", None)
                if made and checkpoint is None:
                    lost.append(f"{where}: it streamed but left nothing to go on from")
                if checkpoint is not None:  # another worker goes on from there, exactly
                    other = UpstreamWorker("other", standin.url, "standin", slots=4, token_ids="vllm")
                    try:
                        resumed: list[Event] = []
                        await other.resume(checkpoint, resumed.append)
                        deadline = time.monotonic() + 10
                        while (not resumed or isinstance(resumed[-1], Delta)) and time.monotonic() < deadline:
                            await asyncio.sleep(0.01)
                    finally:
                        await other.close()
                    done = resumed[-1] if resumed else None
                    if not isinstance(done, Done) or done.text != expected.text:
                        lost.append(f"{where}: resumed elsewhere it did not make the same text")
        return lost

    assert asyncio.run(main()) == []


async def one_run(kind: str, standin: StandInProcess, max_tokens: int) -> Done:
    """One uninterrupted run's end (what a run stopped part-way must come to)."""
    ref = UpstreamWorker("ref", standin.url, "standin", slots=4, token_ids="vllm")
    events: list[Event] = []
    try:
        await ref.run(make_job(kind, "ref", max_tokens), events.append)
        deadline = time.monotonic() + 10
        while (not events or isinstance(events[-1], Delta)) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        await ref.close()
    assert isinstance(events[-1], Done), events[-1:]
    return events[-1]


def make_job(kind: str, job_id: str, max_tokens: int) -> Job:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    if kind == "chat":
        return Job(
            id=job_id, model="standin", messages=({"role": "user", "content": "go on"},), params=params
        )
    return Job(id=job_id, model="standin", prompt="go on", params=params)


def test_the_stand_in_counts_open_requests(standin: StandInProcess, tmp_path: Path) -> None:
    """(The count the tests above rest on: a request streaming is open, one ended is not.)"""

    async def main() -> tuple[int, int]:
        async with httpx.AsyncClient(timeout=10) as client:
            worker = UpstreamWorker("up", standin.url, "standin", slots=4, token_ids="vllm")
            events: list[Event] = []
            await worker.run(make_job("completion", "x", MAX_TOKENS), events.append)
            while not events:
                await asyncio.sleep(0.01)
            during = await open_requests(client, standin)
            await worker.close()
            return during, await settled(client, standin)

    assert asyncio.run(main()) == (1, 0)
