"""The simulated worker behaves like an engine: slots, pacing, exact preemption, cancel."""

from __future__ import annotations

import asyncio

import pytest

from laneway.backends.base import Worker, stream
from laneway.backends.simulated import SimulatedWorker
from laneway.errors import BackendError
from laneway.generation import Delta, Done, Event, Job, SamplingParams, Stopped


def job(jid: str, max_tokens: int = 20, prompt: str = "hello") -> Job:
    return Job(jid, "sim", SamplingParams(max_tokens=max_tokens), prompt=prompt)


async def collect(worker: SimulatedWorker, j: Job) -> list[Event]:
    return [e async for e in stream(worker, j)]


def test_is_a_worker_and_writes_max_tokens() -> None:
    async def main() -> None:
        w = SimulatedWorker("s", slots=2, tokens_per_s=None)
        assert isinstance(w, Worker)
        events = await collect(w, job("a", 7))
        deltas = [e for e in events if isinstance(e, Delta)]
        done = events[-1]
        assert isinstance(done, Done)
        assert len(deltas) == 7 and done.finish_reason == "length"
        assert done.text == "".join(d.text for d in deltas)
        assert done.usage.completion_tokens == 7
        again = await collect(w, job("b", 7))
        assert again[-1].text == done.text  # type: ignore[union-attr]  # deterministic
        assert (await w.health()).ok
        await w.close()

    asyncio.run(main())


def test_paced_and_stop_after() -> None:
    async def main() -> None:
        w = SimulatedWorker("s", slots=1, tokens_per_s=200.0, stop_after=5)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        events = await collect(w, job("a", 50))
        assert loop.time() - t0 >= 5 / 200.0 * 0.8
        assert isinstance(events[-1], Done) and events[-1].finish_reason == "stop"
        assert events[-1].usage.completion_tokens == 5

    asyncio.run(main())


def test_stop_strings_end_the_text_just_before_the_first() -> None:
    async def main() -> None:
        w = SimulatedWorker("s", slots=1, tokens_per_s=None)
        whole = (await collect(w, job("whole", 30)))[-1]
        assert isinstance(whole, Done)
        words = whole.text.split(" ")
        stop = f"{words[3][1:]} {words[4][:2]}"  # (across two words: held back until it is one)
        at = whole.text.index(stop)
        params = SamplingParams(max_tokens=30, stop=("never here", stop))
        events = await collect(w, Job("cut", "sim", params, prompt="hello"))
        done = events[-1]
        assert isinstance(done, Done) and done.finish_reason == "stop" and done.text == whole.text[:at]
        assert "".join(e.text for e in events if isinstance(e, Delta)) == done.text
        assert done.usage.completion_tokens == 5  # (the words made, the one the stop ends in too)
        missed = await collect(
            w, Job("none", "sim", SamplingParams(max_tokens=30, stop=("zz",)), prompt="hello")
        )
        assert missed[-1].text == whole.text and missed[-1].finish_reason == "length"  # type: ignore[union-attr]

    asyncio.run(main())


def test_preempt_and_resume_continue_the_text() -> None:
    async def main() -> None:
        w = SimulatedWorker("s", slots=1, tokens_per_s=500.0)
        alone = (await collect(w, job("solo", 30)))[-1]
        events: asyncio.Queue[Event] = asyncio.Queue()
        await w.run(job("x", 30), events.put_nowait)
        seen = []
        while len(seen) < 5:
            seen.append(await asyncio.wait_for(events.get(), 5))
        await w.preempt("x", "checkpoint")
        while True:
            e = await asyncio.wait_for(events.get(), 5)
            if isinstance(e, Stopped):
                break
            seen.append(e)
        assert w.capacity().busy == 0
        ckpt = e.checkpoint
        assert ckpt.tokens_done == len(seen) and ckpt.nbytes > 0
        assert ckpt.text_so_far == "".join(d.text for d in seen)  # type: ignore[union-attr]
        await w.resume(ckpt, events.put_nowait)
        while True:
            e = await asyncio.wait_for(events.get(), 5)
            if isinstance(e, Done):
                break
            seen.append(e)
        assert "".join(d.text for d in seen) == alone.text == e.text  # type: ignore[union-attr]

    asyncio.run(main())


def test_preempt_before_it_ran_still_stops() -> None:
    async def main() -> None:
        w = SimulatedWorker("s", slots=1, tokens_per_s=10.0)
        events: asyncio.Queue[Event] = asyncio.Queue()
        await w.run(job("x"), events.put_nowait)
        await w.preempt("x", "recompute")
        e = await asyncio.wait_for(events.get(), 5)
        assert isinstance(e, Stopped) and e.checkpoint.mode == "recompute" and e.checkpoint.nbytes == 0
        await w.preempt("gone", "checkpoint")  # not here: nothing happens

    asyncio.run(main())


def test_cancel_frees_the_slot_and_slots_are_bounded() -> None:
    async def main() -> None:
        w = SimulatedWorker("s", slots=1, tokens_per_s=10.0)
        events: asyncio.Queue[Event] = asyncio.Queue()
        await w.run(job("x"), events.put_nowait)
        with pytest.raises(BackendError):
            await w.run(job("y"), events.put_nowait)
        await w.cancel("x")
        e = await asyncio.wait_for(events.get(), 5)
        assert isinstance(e, Done) and e.finish_reason == "cancelled"
        assert w.capacity().busy == 0
        await w.run(job("y", 2), events.put_nowait)
        await w.close()
        assert not (await w.health()).ok

    asyncio.run(main())


def test_bad_settings() -> None:
    with pytest.raises(ValueError):
        SimulatedWorker("s", slots=0)
    with pytest.raises(ValueError):
        SimulatedWorker("s", tokens_per_s=0)
