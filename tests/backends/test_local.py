"""The in-process engine behind the worker protocol, driven from an event loop."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from laneway.backends.base import Worker, stream
from laneway.backends.local import LocalWorker
from laneway.engine.models import load_model
from laneway.errors import ContextTooLong
from laneway.generation import Delta, Done, Event, Job, SamplingParams, Stopped

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
