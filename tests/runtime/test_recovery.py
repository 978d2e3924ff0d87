"""A failing worker: its requests run elsewhere, it is probed until healthy, then used again;
with no worker left, requests are held, then answered 503."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from laneway.backends.base import Health, Sink
from laneway.backends.simulated import SimulatedWorker
from laneway.backends.upstream import UpstreamUnavailable
from laneway.config import ServerConfig, WorkerConfig
from laneway.errors import BackendError, ContextTooLong, GenerationFailed, Unavailable
from laneway.generation import Done, Failed, Job, SamplingParams
from laneway.runtime import Runtime


class Flaky(SimulatedWorker):
    """Fails every job with ``error`` while ``broken``; unhealthy while broken."""

    def __init__(self, name: str, error: Exception, broken: bool = True) -> None:
        super().__init__(name, "sim", 1, tokens_per_s=None)
        self.broken = broken
        self.error = error
        self.failed = 0

    async def run(self, job: Job, sink: Sink) -> None:
        if self.broken:
            self.failed += 1
            asyncio.get_running_loop().call_soon(sink, Failed(job.id, self.error))
            return
        await super().run(job, sink)

    async def health(self) -> Health:
        return Health(not self.broken)


def config(names: tuple[str, ...] = ("flaky", "good"), **kw: object) -> ServerConfig:
    workers = tuple(WorkerConfig(n, "simulated", "sim", "sim", 1) for n in names)
    return replace(ServerConfig(), workers=workers, probe_interval_s=0.05, **kw)  # type: ignore[arg-type]


def job(jid: str) -> Job:
    return Job(jid, "sim", SamplingParams(max_tokens=3, temperature=0.0), prompt="p")


def test_retryable_failure_runs_elsewhere_and_the_worker_comes_back() -> None:
    async def main() -> None:
        flaky = Flaky("flaky", UpstreamUnavailable("connection refused", malformed=False), broken=False)
        rt = Runtime(config(), {"flaky": flaky, "good": SimulatedWorker("good", "sim", 1, tokens_per_s=None)})
        await rt.start()
        try:
            assert not rt.recovery.down
            flaky.broken = True  # between two probes: the first request finds out
            done = await asyncio.wait_for(rt.submit(job("a"), 1).result(), 5)
            assert isinstance(done, Done) and flaky.failed == 1
            assert rt.recovery.down == {"flaky"}
            assert (await asyncio.wait_for(rt.submit(job("b"), 1).result(), 5)).text
            assert flaky.failed == 1  # out of placement: not tried again
            flaky.broken = False
            for _ in range(100):  # the probe brings it back
                if not rt.recovery.down:
                    break
                await asyncio.sleep(0.02)
            assert not rt.recovery.down
            tickets = [rt.submit(job(f"c{i}"), 1) for i in range(2)]  # two at once: both workers run
            for t in tickets:
                await asyncio.wait_for(t.result(), 5)
            assert {t.worker for t in tickets} == {"flaky", "good"}
        finally:
            await rt.close()

    asyncio.run(main())


def test_non_retryable_failure_fails_the_request_and_no_worker_left_is_a_503() -> None:
    async def main() -> None:
        broken = Flaky("flaky", BackendError("the engine broke"))
        good = SimulatedWorker("good", "sim", 1, tokens_per_s=None)
        rt = Runtime(config(), {"flaky": broken, "good": good})
        try:
            with pytest.raises(GenerationFailed, match="engine broke"):
                await asyncio.wait_for(rt.submit(job("a"), 1).result(), 5)
            assert not rt.recovery.down
        finally:
            await rt.close()
        both = {n: Flaky(n, UpstreamUnavailable("down", malformed=False)) for n in ("flaky", "good")}
        rt = Runtime(config(unavailable_hold_s=0.3), both)  # not started: they look healthy
        try:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(Unavailable, match="no healthy worker serves model 'sim'") as info:
                await asyncio.wait_for(rt.submit(job("b"), 1).result(), 5)
            assert 0.3 <= loop.time() - t0 < 3.0  # held, then answered
            assert info.value.status == 503 and info.value.code == "no_healthy_worker"
            assert info.value.retry_after_s >= 1
            assert info.value.estimated_wait_s is None  # (no worker is up: not known)
            assert sum(w.failed for w in both.values()) == 2  # both tried, then it waited for one
            assert rt.recovery.down == {"flaky", "good"}
        finally:
            await rt.close()

    asyncio.run(main())


def test_a_run_failing_on_a_worker_already_removed_still_ends_its_request() -> None:
    """A fleet's worker leaves (its probes stop first) while a dispatch to it is on its way:
    the run fails there, and the request must end — taking the worker out of placement,
    which knows it no more, raised inside the failure and left the request running for
    ever."""

    class FailsRuns(Flaky):
        async def health(self) -> Health:
            return Health(True)

    async def main() -> None:
        leaving = FailsRuns("leaving", UpstreamUnavailable("the connection pool is closed", malformed=False))
        down = Flaky(
            "down", UpstreamUnavailable("down", malformed=False)
        )  # (unhealthy: the request cannot go there)
        rt = Runtime(config(("leaving", "down")), {"leaving": leaving, "down": down})
        await rt.start()
        try:
            for _ in range(100):
                if rt.recovery.down == {"down"}:
                    break
                await asyncio.sleep(0.02)
            assert rt.recovery.down == {"down"}
            rt.prober.remove("leaving")  # (as Fleet.remove_worker begins)
            with pytest.raises(Unavailable) as info:  # (every try found no worker to take it)
                await asyncio.wait_for(rt.submit(job("a"), 1).result(), 5)
            assert info.value.code == "upstream_unavailable"
            assert leaving.failed >= 1 and not rt.tickets
        finally:
            await rt.close()

    asyncio.run(main())


def test_a_request_the_engine_refuses_as_too_long_ends_rejected_not_failed() -> None:
    """An engine's 400 (the prompt over its context, found only when it tokenizes it) is the
    client's error, as one refused on arrival: counted rejected, the client told why, the
    worker not taken out of placement."""

    class Refuses(Flaky):
        async def health(self) -> Health:
            return Health(True)

    async def main() -> None:
        refuses = Refuses("flaky", ContextTooLong("the prompt is 5,000 tokens; the context is 4,096"))
        rt = Runtime(config(("flaky",)), {"flaky": refuses})
        await rt.start()
        try:
            with pytest.raises(ContextTooLong, match="context is 4,096"):
                await asyncio.wait_for(rt.submit(job("a"), 1).result(), 5)
            assert refuses.failed == 1 and not rt.recovery.down
            name = rt.classes[1].name
            assert rt.metrics.ended[name, "rejected"]._value.get() == 1
            assert rt.metrics.ended[name, "failed"]._value.get() == 0
            refuses.error = BackendError("the engine broke")  # (an engine's own fault stays failed)
            with pytest.raises(GenerationFailed):
                await asyncio.wait_for(rt.submit(job("b"), 1).result(), 5)
            assert rt.metrics.ended[name, "failed"]._value.get() == 1
        finally:
            await rt.close()

    asyncio.run(main())
