"""The runtime drives the core scheduler on a real clock with simulated workers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

import pytest

from laneway.backends.simulated import SimulatedWorker
from laneway.config import ServerConfig, WorkerConfig
from laneway.core import ClassTable
from laneway.errors import ClassNotAllowed, GenerationFailed, QuotaExceeded, Unavailable
from laneway.generation import Delta, Done, Job, SamplingParams
from laneway.runtime import Phase, Runtime, Ticket

TIMEOUT_S = 10.0


def config(slots: int = 1, **changes: object) -> ServerConfig:
    worker = WorkerConfig("sim0", "simulated", "sim", "sim", slots)
    return replace(ServerConfig(), workers=(worker,), **changes)  # type: ignore[arg-type]


def job(jid: str, max_tokens: int = 10, prompt: str = "p") -> Job:
    return Job(jid, "sim", SamplingParams(max_tokens=max_tokens, temperature=0.0), prompt=prompt)


def run_with(
    cfg: ServerConfig, tokens_per_s: float | None, body: Callable[[Runtime, SimulatedWorker], Awaitable[None]]
) -> None:
    async def main() -> None:
        worker = SimulatedWorker("sim0", "sim", cfg.workers[0].slots, tokens_per_s=tokens_per_s)
        rt = Runtime(cfg, {"sim0": worker})
        try:
            await asyncio.wait_for(body(rt, worker), TIMEOUT_S)
        finally:
            await rt.close()

    asyncio.run(main())


async def text_of(ticket: Ticket) -> str:
    parts = [e.text async for e in ticket.events() if isinstance(e, Delta)]
    return "".join(parts)


async def until(pred: Callable[[], bool]) -> None:
    while not pred():
        await asyncio.sleep(0.005)


def test_requests_complete_in_class_order() -> None:
    async def body(rt: Runtime, worker: SimulatedWorker) -> None:
        first = rt.submit(job("a", 5), 1)  # P1: never preempted
        await until(lambda: first.phase is Phase.RUNNING)  # it takes the only slot
        later = [rt.submit(job("p2"), 2), rt.submit(job("p1"), 1), rt.submit(job("p0"), 0)]
        order: list[str] = []

        async def wait(t: Ticket) -> None:
            await t.result()
            order.append(t.id)

        await asyncio.gather(wait(first), *(wait(t) for t in later))
        assert order == ["a", "p0", "p1", "p2"]
        assert rt.sched.live == 0 and not rt.tickets

    run_with(config(), 500.0, body)


def test_preemption_resumes_with_continuous_text() -> None:
    async def body(rt: Runtime, worker: SimulatedWorker) -> None:
        alone = await text_of(rt.submit(job("solo", 40), 3))
        low = rt.submit(job("low", 40), 3)
        chunks: list[str] = []
        async for e in low.events():
            if isinstance(e, Delta):
                chunks.append(e.text)
                if len(chunks) == 5:
                    high = rt.submit(job("high", 3), 0)
        done = await high.result()
        assert done.finish_reason == "length"
        assert "".join(chunks) == alone
        assert low.preemptions >= 1 and low.ended and high.preemptions == 0
        assert rt.metrics.preemptions.labels("P3")._value.get() >= 1
        assert worker.capacity().busy == 0

    run_with(config(), 400.0, body)


def test_cancel_frees_the_slot_and_drops_queued_work() -> None:
    async def body(rt: Runtime, worker: SimulatedWorker) -> None:
        running = rt.submit(job("r", 1000), 2)
        queued = rt.submit(job("q", 5), 2)
        await until(lambda: running.phase is Phase.RUNNING and worker.capacity().busy == 1)
        rt.cancel(queued)
        rt.cancel(running)
        with pytest.raises(GenerationFailed):
            await running.result()
        await until(lambda: worker.capacity().busy == 0)
        assert rt.sched.free_slots == 1 and rt.sched.live == 0
        assert (await rt.submit(job("next", 2), 2).result()).finish_reason == "length"
        rt.cancel(running)  # twice: nothing happens

    run_with(config(), 100.0, body)


def test_queue_timeout_is_a_503_with_an_estimate() -> None:
    classes = ClassTable()
    p2 = replace(classes[2], timeout_s=0.1)
    table = ClassTable((*classes.classes[:2], p2, classes[3]))
    # (without the bound by the expected wait, which refuses such a request at once: below)
    cfg = config(scheduler=replace(ServerConfig().scheduler, classes=table, max_wait_s=None))

    async def body(rt: Runtime, worker: SimulatedWorker) -> None:
        long = rt.submit(job("long", 1000), 3)
        await until(lambda: long.phase is Phase.RUNNING)
        waiting = rt.submit(job("w"), 2)
        with pytest.raises(Unavailable) as info:
            await waiting.result()
        err = info.value
        assert err.status == 503 and err.code == "queue_timeout"
        assert err.retry_after_s >= 1.0 and err.estimated_wait_s >= 0.0
        assert rt.metrics.rejections.labels("queue_timeout")._value.get() == 1
        # its wait is its time in the queue (the access log's, the trace's), and is counted
        assert 0.1 <= waiting.queue_s < 5.0
        waited = rt.metrics.queue_wait.labels("P2")
        assert waited._sum.get() >= 0.1 and sum(b.get() for b in waited._buckets) == 1

    run_with(cfg, 100.0, body)


def test_an_arrival_expected_to_wait_past_its_limit_is_refused_at_once() -> None:
    classes = ClassTable()
    p2 = replace(classes[2], timeout_s=0.5)
    table = ClassTable((*classes.classes[:2], p2, classes[3]))
    cfg = config(scheduler=replace(ServerConfig().scheduler, classes=table, max_wait_s=2.0))

    async def body(rt: Runtime, worker: SimulatedWorker) -> None:
        long = rt.submit(job("long", 1000), 3)  # 10 s on the only slot
        await until(lambda: long.phase is Phase.RUNNING)
        for cls, code, limit in (
            (2, "queue_timeout", "queue timeout (0.5 s)"),
            (3, "overloaded", "limit (2 s)"),
        ):
            with pytest.raises(Unavailable) as info:
                rt.submit(job(f"w{cls}"), cls)
            err = info.value
            assert err.status == 503 and err.code == code and limit in err.message
            assert err.estimated_wait_s > 2.0 and err.retry_after_s == err.estimated_wait_s
        assert rt.submit(job("p0"), 0).phase is Phase.QUEUED  # P0 may preempt: its wait is short
        assert long.phase is Phase.RUNNING or long.phase is Phase.STOPPING

    run_with(cfg, 100.0, body)


def test_queue_wait_alert_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    cfg = config(alert_wait_s=(None, None, 0.05, None))

    async def body(rt: Runtime, worker: SimulatedWorker) -> None:
        long = rt.submit(job("long", 30), 3)
        await until(lambda: long.phase is Phase.RUNNING)
        waiting = rt.submit(job("w", 2), 2)
        await waiting.result()
        assert rt.metrics.alerts.labels("P2")._value.get() == 1

    with caplog.at_level(logging.WARNING, logger="laneway.alerts"):
        run_with(cfg, 100.0, body)
    alerts = [r for r in caplog.records if "queue_wait_alert" in r.getMessage()]
    assert len(alerts) == 1
    assert alerts[0].laneway["class"] == "P2" and alerts[0].laneway["request_id"] == "w"  # type: ignore[attr-defined]


def test_refusals_raise_client_errors() -> None:
    from laneway.config import parse_config

    cfg = parse_config(
        {
            "workers": [{"name": "sim0", "type": "simulated", "model": "sim", "slots": 1}],
            "tenants": {"t": {"allowed": ["P2"], "quotas": {"P2": {"rate_per_s": 0.001, "burst": 1}}}},
        }
    )

    async def body(rt: Runtime, worker: SimulatedWorker) -> None:
        with pytest.raises(ClassNotAllowed):
            rt.submit(job("a"), 0, tenant="t")
        await rt.submit(job("b", 1), 2, tenant="t").result()
        with pytest.raises(QuotaExceeded) as info:
            rt.submit(job("c"), 2, tenant="t")
        assert info.value.status == 429 and info.value.retry_after_s >= 1

    run_with(cfg, None, body)


def test_close_answers_waiting_requests() -> None:
    async def main() -> None:
        worker = SimulatedWorker("sim0", "sim", 1, tokens_per_s=10.0)
        rt = Runtime(config(), {"sim0": worker})
        tickets = [rt.submit(job(f"r{i}", 100), 2) for i in range(3)]
        await asyncio.sleep(0.05)
        await rt.close()
        for t in tickets:
            with pytest.raises(Unavailable):
                await asyncio.wait_for(t.result(), TIMEOUT_S)
        with pytest.raises(Unavailable):
            rt.submit(job("late"), 0)
        assert isinstance(Done, type)

    asyncio.run(main())


def test_a_request_s_size_is_its_estimate_before_its_class_has_history() -> None:
    """Batch work submitted before any finished is not given the mean of the short urgent requests
    measured so far (it would be expected to end "at once"): its max_tokens at the measured pace."""

    async def body(rt: Runtime, worker: SimulatedWorker) -> None:
        for i in range(3):
            await rt.submit(job(f"p{i}", max_tokens=4), 0).result()  # short P0 probes
        ticket = rt.submit(job("batch", max_tokens=1000), 2)
        short = rt.sched.service.overall  # what an unmeasured class would borrow: ~8 ms
        est = rt.sched.get(ticket.id).est_s
        assert est > 100 * short
        # 1,000 tokens at the pace measured on the short ones (500 tokens/s at most: slower on a
        # busy machine, where the engine's timer wakes late)
        pace = rt.sizing.decode_tokens_s["sim"]
        assert 0 < pace <= 550 and est > 1.0
        assert est == pytest.approx(1000 / pace, rel=0.05)  # (its short prompt's prefill: µs)
        rt.cancel(ticket)

    run_with(config(), 500.0, body)


def test_requests_past_the_bytes_held_get_a_503_until_others_end() -> None:
    cfg = config(max_queued_bytes=3 << 20)

    async def body(rt: Runtime, worker: SimulatedWorker) -> None:
        first = rt.submit(job("a", 10), 3, size=2 << 20)
        assert rt.held_bytes == 2 << 20
        with pytest.raises(Unavailable) as info:
            rt.submit(job("b", 10), 0, size=2 << 20)
        assert info.value.code == "overloaded" and "limit 3 MiB" in info.value.message
        assert "holds 2 MiB" in info.value.message and "this one is 2 MiB" in info.value.message
        with pytest.raises(Unavailable) as info:  # (under a MiB: not "0 MiB")
            rt.submit(job("b", 10), 0, size=(3 << 20) - (2 << 20) + (600 << 10))
        assert "this one is 1.6 MiB" in info.value.message, info.value.message
        await first.result()
        assert rt.held_bytes == 0
        await rt.submit(job("c", 10), 0, size=2 << 20).result()
        assert rt.held_bytes == 0

    run_with(cfg, 1000.0, body)


def test_the_classes_a_policy_may_stop() -> None:
    from laneway.core.classes import ClassTable
    from laneway.core.policies import stoppable_classes

    classes = ClassTable()
    assert stoppable_classes(classes, "laneway") == {2, 3}  # P0 and P1 are never preempted
    assert stoppable_classes(classes, "mlfq") == {2, 3}
    assert stoppable_classes(classes, "graceful") == {2, 3}  # (past its drain cap, it preempts)
    for name in ("fifo", "priority"):
        assert stoppable_classes(classes, name) == frozenset()


def test_a_prompt_of_text_parts_is_sized_by_its_text() -> None:
    from laneway.core import CostModel
    from laneway.generation import CHAT, Job, SamplingParams
    from laneway.runtime.sizing import Sizing

    sizing = Sizing(CostModel(), 256)
    parts = [{"type": "text", "text": "x" * 2000}, {"type": "text", "text": "y" * 400}]
    job = Job("r", "m", SamplingParams(), messages=({"role": "user", "content": parts},), kind=CHAT)
    plain = Job("p", "m", SamplingParams(), messages=({"role": "user", "content": "x" * 2400},), kind=CHAT)
    assert sizing.prompt_tokens(job) == sizing.prompt_tokens(plain) == 601


def test_a_request_is_sized_no_longer_than_its_model_s_context() -> None:
    """A max_tokens past the context its workers say counts as that context (the engine ends
    it there), in its size and in a quota's charge; where the context is not known, as asked."""
    from laneway.core import CostModel
    from laneway.generation import Job, SamplingParams
    from laneway.runtime.sizing import Sizing

    sizing = Sizing(CostModel(), 256)
    huge = Job("r", "m", SamplingParams(max_tokens=100_000, n=2), prompt="hi")
    assert sizing.output_tokens(huge) == 200_000
    sizing.context_of = {"m": 4096}.get
    assert sizing.output_tokens(huge) == 2 * 4096
    assert sizing.output_tokens(Job("s", "m", SamplingParams(max_tokens=16), prompt="hi")) == 16
    assert sizing.output_tokens(Job("o", "other", SamplingParams(max_tokens=100_000), prompt="hi")) == 100_000


def test_a_runtime_knows_its_model_s_context_from_its_workers() -> None:
    async def body(rt: Runtime, worker: SimulatedWorker) -> None:
        assert rt.context_of("sim") is None  # (its worker does not say)
        worker.max_model_len = 64
        assert rt.context_of("sim") == 64 and rt.context_of("other") is None
        ticket = rt.submit(job("long", max_tokens=100_000), 3)
        assert rt.sched.live_requests.reqs["long"].output_tokens == 64  # (sized, and charged, at most that)
        rt.cancel(ticket)

    run_with(config(), 500.0, body)


def test_a_p0_s_slot_is_kept_for_its_next_request_then_goes_to_the_waiting_batch_work() -> None:
    """The server's default ``hold_s`` (0.25 s): an urgent client's next request takes the
    slot its last one freed, preempting nothing; when none comes, the batch work waiting
    starts once the hold lapses (the runtime wakes for it)."""
    hold_s = ServerConfig().scheduler.hold_s
    assert hold_s == 0.25

    async def body(rt: Runtime, worker: SimulatedWorker) -> None:
        first = rt.submit(job("turn1", 5), 0)
        await until(lambda: first.phase is Phase.RUNNING)
        batch = rt.submit(job("batch", 5), 3)
        await first.result()
        second = rt.submit(job("turn2", 5), 0)  # (the agent's next step, at once)
        await second.result()
        assert batch.preemptions == 0 and batch.phase is Phase.QUEUED
        ended = asyncio.get_running_loop().time()
        await until(lambda: batch.phase is not Phase.QUEUED)
        waited = asyncio.get_running_loop().time() - ended
        assert 0.1 < waited < 2.0  # (the hold, and no more than a generous bound)
        assert (await batch.result()).finish_reason == "length"
        assert rt.metrics.preemptions.labels("P3")._value.get() == 0

    run_with(config(), 500.0, body)


def test_a_request_stopped_as_its_worker_went_down_is_held_for_one_not_queued_for_ever() -> None:
    """A preemption under way when the worker is taken out of placement: the stopped
    request comes back to a queue with no worker of its model up. It waits the hold for
    one, as the queued ones do, then gets 503 ``no_healthy_worker`` — not queued with no
    timeout (P3) until some worker came back."""
    cfg = config(unavailable_hold_s=0.3)

    async def body(rt: Runtime, worker: SimulatedWorker) -> None:
        gate = asyncio.Event()
        stop = worker.preempt

        async def late_stop(job_id: str, mode: str) -> None:
            await gate.wait()  # (the stop reaches the worker after it was taken out)
            await stop(job_id, mode)

        worker.preempt = late_stop  # type: ignore[method-assign]
        low = rt.submit(job("low", 1000), 3)
        await until(lambda: low.phase is Phase.RUNNING)
        high = rt.submit(job("high", 3), 0)
        await until(lambda: low.phase is Phase.STOPPING)
        rt.prober.take_out("sim0", "its engine went away")
        gate.set()
        for ticket in (low, high):
            with pytest.raises(Unavailable) as info:
                await asyncio.wait_for(ticket.result(), 5.0)
            assert info.value.code == "no_healthy_worker"
        assert low.preemptions == 1

    run_with(cfg, 100.0, body)
