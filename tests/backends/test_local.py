"""The in-process engine behind the worker protocol, driven from an event loop."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from laneway.backends.base import Worker, stream
from laneway.backends.local import LocalWorker
from laneway.engine.models import load_model
from laneway.errors import ContextTooLong
from laneway.generation import Delta, Done, Event, Failed, Job, SamplingParams, Stopped

GREEDY = SamplingParams(max_tokens=60, temperature=0.0)


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    return load_model("builtin:tiny", "cpu")


def test_stream_preempt_resume_cancel_and_health(tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        worker = await LocalWorker.create("w0", tiny, slots=2, data_dir=tmp_path)
        assert isinstance(worker, Worker)
        try:
            assert worker.capacity().slots == 2 and worker.capacity().models == ("builtin:tiny",)
            job = Job("a", "builtin:tiny", GREEDY, prompt="hello")
            ref = [e async for e in stream(worker, job)]
            assert isinstance(ref[-1], Done) and ref[-1].usage.completion_tokens == 60
            ref_text = ref[-1].text

            events: asyncio.Queue[Event] = asyncio.Queue()
            await worker.run(job, events.put_nowait)
            first = await asyncio.wait_for(events.get(), 10)
            assert isinstance(first, Delta)
            t0 = time.perf_counter()
            await worker.preempt("a", "checkpoint")
            ev = await asyncio.wait_for(events.get(), 10)
            while isinstance(ev, Delta):
                ev = await asyncio.wait_for(events.get(), 10)
            assert isinstance(ev, Stopped)
            assert time.perf_counter() - t0 < 5.0  # generous: a step is milliseconds
            assert worker.capacity().busy == 0
            await worker.resume(ev.checkpoint, events.put_nowait)
            tail = []
            while not isinstance(ev := await asyncio.wait_for(events.get(), 10), Done):
                tail.append(ev)
            assert ev.text == ref_text

            await worker.run(Job("c", "builtin:tiny", GREEDY, prompt="cancel me"), events.put_nowait)
            await worker.cancel("c")
            while not isinstance(ev := await asyncio.wait_for(events.get(), 10), Done):
                pass
            assert ev.finish_reason == "cancelled" and worker.capacity().busy == 0

            with pytest.raises(ContextTooLong):
                await worker.run(Job("x", "builtin:tiny", GREEDY, prompt="x" * 3000), events.put_nowait)
            assert (await worker.health()).ok
        finally:
            await worker.close()
        assert not (await worker.health()).ok

    asyncio.run(main())


def test_several_choices_run_as_one_job_and_resume_together(tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """n = 3: three sequences in one slot; choice i of a seeded request samples with seed + i,
    so it equals a one-choice run with that seed; a preemption stops and resumes all three."""
    params = SamplingParams(max_tokens=40, temperature=1.0, seed=11, n=3)

    async def main() -> None:
        worker = await LocalWorker.create("w0", tiny, slots=1, data_dir=tmp_path)
        try:
            singles = []
            for i in range(3):
                one = Job(
                    f"s{i}",
                    "builtin:tiny",
                    SamplingParams(max_tokens=40, temperature=1.0, seed=11 + i),
                    prompt="n",
                )
                singles.append([e async for e in stream(worker, one)][-1])
            events: asyncio.Queue[Event] = asyncio.Queue()
            await worker.run(Job("n", "builtin:tiny", params, prompt="n"), events.put_nowait)
            assert worker.capacity().busy == 1  # one job, whatever its choices
            seen: list[Event] = []
            while sum(isinstance(e, Delta) for e in seen) < 12:
                seen.append(await asyncio.wait_for(events.get(), 10))
            await worker.preempt("n", "checkpoint")
            while not isinstance(ev := await asyncio.wait_for(events.get(), 10), Stopped):
                seen.append(ev)
            assert worker.capacity().busy == 0
            await worker.resume(ev.checkpoint, events.put_nowait)
            while not isinstance(ev := await asyncio.wait_for(events.get(), 10), Done):
                seen.append(ev)
            assert [c.index for c in ev.choices] == [0, 1, 2]
            assert [c.text for c in ev.choices] == [s.text for s in singles]
            for i in range(3):  # each choice's deltas carry its index and add up to its text
                assert (
                    "".join(e.text for e in seen if isinstance(e, Delta) and e.index == i) == singles[i].text
                )
            assert (
                ev.usage.completion_tokens == 120 and ev.usage.prompt_tokens == singles[0].usage.prompt_tokens
            )
        finally:
            await worker.close()

    asyncio.run(main())


def test_an_engine_that_broke_is_started_again_by_the_health_probe(
    tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        worker = await LocalWorker.create("w0", tiny, slots=2, data_dir=tmp_path)
        try:
            engine = worker.engine
            real = engine.step

            def broken() -> None:
                raise RuntimeError("device lost")

            monkeypatch.setattr(engine, "step", broken)
            for i in range(3):  # three steps in a row fail as a whole: the engine stops
                got = [e async for e in stream(worker, Job(f"j{i}", "builtin:tiny", GREEDY, prompt="x"))]
                assert isinstance(got[-1], Failed) and "device lost" in str(got[-1].error)
            deadline = time.monotonic() + 10
            while worker._runner.alive:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            assert worker.capacity().busy == 0
            monkeypatch.setattr(engine, "step", real)
            health = await worker.health()
            assert not health.ok and "device lost" in health.detail  # this probe found it stopped
            assert (await worker.health()).ok  # ... and started it again: the next one finds it well
            again = [e async for e in stream(worker, Job("k", "builtin:tiny", GREEDY, prompt="hello"))]
            assert isinstance(again[-1], Done) and again[-1].usage.completion_tokens == 60
        finally:
            await worker.close()

    asyncio.run(main())


def test_a_request_sent_as_the_engine_breaks_down_is_refused_not_left_waiting(
    tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """A request that comes while the engine's third failing step runs (after which its thread
    stops taking work) is refused with the engine's failure: its start was left queued for a
    thread that had gone, and its client waited for ever."""

    async def main() -> None:
        worker = await LocalWorker.create("w0", tiny, slots=4, data_dir=tmp_path)
        try:
            steps = 0
            third, release = threading.Event(), threading.Event()

            def broken() -> None:
                nonlocal steps
                steps += 1
                if steps == 3:
                    third.set()
                    release.wait(10)
                raise RuntimeError("device lost")

            monkeypatch.setattr(worker.engine, "step", broken)
            for i in range(2):
                got = [e async for e in stream(worker, Job(f"j{i}", "builtin:tiny", GREEDY, prompt="x"))]
                assert isinstance(got[-1], Failed)
            last = asyncio.create_task(anext(stream(worker, Job("j2", "builtin:tiny", GREEDY, prompt="x"))))
            assert await asyncio.to_thread(third.wait, 10)  # the third failing step runs now
            late: list[Event] = []
            job = Job("late", "builtin:tiny", GREEDY, prompt="x")
            start = asyncio.create_task(worker.run(job, late.append))
            await asyncio.sleep(0.1)  # (its start is queued for the engine's thread)
            release.set()
            with pytest.raises(RuntimeError, match="the engine is down: device lost"):
                await asyncio.wait_for(start, 10)
            assert isinstance(await asyncio.wait_for(last, 10), Failed)
        finally:
            release.set()
            await worker.close()

    asyncio.run(main())
