"""Upstream capabilities are learnt, not assumed: under the default ``token_ids = "vllm"``,
an engine that refuses ``return_token_ids`` (another laneway serving a simulated worker;
the stand-in told to refuse it) serves every request, and preempted requests resume by
text there; one that refuses prompts of token ids resumes by text; one that refuses
``continue_final_message`` restarts a chat its client has not seen and does not stop one
being streamed. What was learnt is on ``/readyz``, and forgotten when the engine was
unreachable."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from laneway.backends.inprocess import InProcess
from laneway.backends.upstream import UpstreamWorker
from laneway.generation import Delta, Done, Event, Job, SamplingParams, Stopped
from laneway.standin import StandIn
from laneway.testing import StandInProcess, serve_process

TOKENS = 30


@pytest.fixture(scope="module")
def sim_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A laneway serving a simulated worker (it refuses return_token_ids): its /v1 URL."""
    path: Path = tmp_path_factory.mktemp("simup")
    cfg = path / "sim.toml"
    cfg.write_text(
        '[[workers]]\nname = "sim0"\ntype = "simulated"\nmodel = "sim"\nslots = 4\ntokens_per_s = 400\n'
    )
    with serve_process("--config", str(cfg), "--data-dir", str(path / "d"), log=path / "serve.log") as s:
        yield s.url + "/v1"


def job(kind: str, job_id: str, model: str, *, stream: bool = False) -> Job:
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0)
    if kind == "chat":
        msgs = ({"role": "user", "content": "tell me"},)
        return Job(id=job_id, model=model, messages=msgs, params=params, stream=stream)
    return Job(id=job_id, model=model, prompt="tell me", params=params, stream=stream)


async def run_to_end(worker: UpstreamWorker, j: Job, preempt_after: int | None = None) -> list[Event]:
    """Run ``j``; preempt it after its ``preempt_after``-th delta and resume it at once."""
    events: list[Event] = []
    await worker.run(j, events.append)
    deadline = time.monotonic() + 30
    preempted = preempt_after is None
    while time.monotonic() < deadline:
        if not preempted and sum(isinstance(e, Delta) for e in events) >= preempt_after:  # type: ignore[operator]
            preempted = True
            await worker.preempt(j.id, "checkpoint")
        if events and isinstance(events[-1], Stopped):
            stopped = events[-1]
            events.pop()
            events.append(Delta(j.id, "", -1))  # (a marker: where the stop was)
            await worker.resume(stopped.checkpoint, events.append)
        if events and not isinstance(events[-1], Delta):
            return events
        await asyncio.sleep(0.005)
    raise AssertionError(f"{j.id} did not end: {events[-3:]}")


def test_an_engine_that_refuses_token_ids_serves_every_request(sim_upstream: str) -> None:
    async def main() -> None:
        worker = UpstreamWorker("up", sim_upstream, "sim", slots=4)  # token_ids "vllm" by default
        try:
            assert worker.caps.token_ids is None
            first = await run_to_end(worker, job("completion", "a", "sim"))
            assert isinstance(first[-1], Done) and first[-1].usage.completion_tokens == TOKENS
            assert worker.caps.token_ids is False  # learnt from the 400, the request sent again
            # from now on no ids are asked; a preempted request resumes by text
            assert worker.resume_method(job("completion", "b", "sim")) == "text"
            for kind in ("completion", "chat"):
                events = await run_to_end(worker, job(kind, f"p-{kind}", "sim"), preempt_after=3)
                done = events[-1]
                assert isinstance(done, Done), events[-1]
                assert done.usage.completion_tokens == TOKENS
                assert any(isinstance(e, Delta) and e.tokens == -1 for e in events)  # it was stopped
            assert worker.caps.continue_final is True  # (the chat resumed by text)
        finally:
            await worker.close()

    asyncio.run(main())


def refusing(tmp_path: Path, *fields: str) -> StandInProcess:
    args: tuple[str, ...] = ("--slots", "4", "--ms-per-token", "5")
    for f in fields:
        args += ("--refuse", f)
    return StandInProcess(tmp_path / f"standin-{'-'.join(fields) or 'all'}.log", args)


def in_process(engine: StandIn, name: str = "up") -> UpstreamWorker:
    """A worker on ``engine``, served in this process (backends/inprocess.py)."""
    return UpstreamWorker(name, "http://standin.invalid/v1", "standin", slots=4, connect=InProcess(engine))


def test_an_engine_that_takes_ids_resumes_by_ids_and_one_that_refuses_id_prompts_by_text() -> None:
    full = StandIn(slots=4, ms_per_token=5)
    no_id_prompts = StandIn(slots=4, ms_per_token=5, refuse=("prompt_ids",))

    async def main() -> None:
        whole = in_process(full, "ref")
        expected = (await run_to_end(whole, job("completion", "ref", "standin")))[-1]
        await whole.close()
        assert isinstance(expected, Done)
        for engine, how in ((full, "token_ids"), (no_id_prompts, "text")):
            worker = in_process(engine)
            try:
                events = await run_to_end(worker, job("completion", "x", "standin"), preempt_after=3)
                done = events[-1]
                assert isinstance(done, Done)
                if how == "token_ids":  # exact (by text, the stand-in's words depend on the prompt)
                    assert done.text == expected.text
                assert done.usage.completion_tokens == TOKENS
                assert worker.caps.token_ids is True
                assert worker.caps.id_prompts is (how == "token_ids")
                assert worker.resume_method(job("completion", "y", "standin")) == how
            finally:
                await worker.close()

    asyncio.run(main())


def test_an_engine_without_continue_final_message() -> None:
    engine = StandIn(slots=4, ms_per_token=5, refuse=("return_token_ids", "continue_final_message"))

    async def main() -> None:
        worker = in_process(engine)
        try:
            ref = (await run_to_end(worker, job("chat", "ref", "standin")))[-1]
            assert isinstance(ref, Done) and worker.caps.token_ids is False
            # a chat its client is not reading: resumed by text is refused, so it starts again
            events = await run_to_end(worker, job("chat", "quiet", "standin"), preempt_after=3)
            assert isinstance(events[-1], Done) and events[-1].text == ref.text
            assert events[-1].usage.completion_tokens == TOKENS
            assert worker.caps.continue_final is False
            assert worker.resume_method(job("chat", "s", "standin", stream=True)) == "none"
            # one being streamed is not stopped: nothing could resume it (it runs to its end)
            streamed: list[Event] = []
            await worker.run(job("chat", "loud", "standin", stream=True), streamed.append)
            while sum(isinstance(e, Delta) for e in streamed) < 3:
                await asyncio.sleep(0.005)
            await worker.preempt("loud", "checkpoint")
            deadline = time.monotonic() + 30
            while isinstance(streamed[-1], Delta) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert isinstance(streamed[-1], Done) and streamed[-1].usage.completion_tokens == TOKENS
            assert not any(isinstance(e, Stopped) for e in streamed)
        finally:
            await worker.close()

    asyncio.run(main())


def test_readyz_shows_what_was_learnt_and_an_outage_forgets_it(tmp_path: Path) -> None:
    engine = refusing(tmp_path)
    port = engine.port
    cfg = tmp_path / "laneway.toml"
    cfg.write_text(
        f'[server]\nprobe_interval_s = 0.2\n[[workers]]\nname = "up"\ntype = "upstream"\n'
        f'url = "{engine.url}"\nmodel = "standin"\nslots = 2\n'
    )
    try:
        with serve_process(
            "--config", str(cfg), "--data-dir", str(tmp_path / "d"), log=tmp_path / "s.log"
        ) as s:
            r = httpx.post(
                s.url + "/v1/completions",
                json={"model": "standin", "prompt": "hi", "max_tokens": 3},
                timeout=30,
            )
            assert r.status_code == 200
            caps = wait_for(s.url, lambda c: c["metrics"] is not None and c["token_ids"] is not None)
            assert caps == {
                "token_ids": True,
                "id_prompts": None,
                "continue_final": None,
                "metrics": "vllm",
                "kv_tokens": 16_384,  # (the stand-in's /metrics says so, as vLLM's does)
            }
            engine.stop()  # unreachable: what was learnt is forgotten
            wait_for(
                s.url,
                lambda c: c["token_ids"] is None and c["metrics"] is None and c["kv_tokens"] is None,
                ready=False,
            )
            engine = StandInProcess(tmp_path / "again.log", ("--refuse", "return_token_ids"), port=port)
            wait_for(s.url, lambda c: c["metrics"] == "vllm")
            r = httpx.post(
                s.url + "/v1/completions",
                json={"model": "standin", "prompt": "hi", "max_tokens": 3},
                timeout=30,
            )
            assert r.status_code == 200  # the engine that came back refuses ids: learnt anew
            assert wait_for(s.url, lambda c: c["token_ids"] is False)["token_ids"] is False
    finally:
        engine.stop()


def wait_for(url: str, check: object, *, ready: bool = True) -> dict[str, object]:
    deadline = time.monotonic() + 20
    while True:
        r = httpx.get(url + "/readyz", timeout=5)
        caps = r.json()["workers"]["up"]["capabilities"]
        if (r.status_code == 200) == ready and check(caps):  # type: ignore[operator]
            return caps  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, (r.status_code, caps)
        time.sleep(0.05)


def test_the_kv_space_is_read_from_vllms_cache_config_info() -> None:
    from laneway.backends.capabilities import kv_tokens_in

    info = 'vllm:cache_config_info{block_size="128",kv_cache_size_tokens="23296",num_gpu_blocks="182"} 1'
    assert kv_tokens_in("# TYPE vllm:cache_config_info gauge\n" + info + "\n") == 23_296
    older = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="2048",enable_prefix_caching="True"} 1.0'
    assert kv_tokens_in(older) == 16 * 2048  # (no kv_cache_size_tokens: blocks x their size)
    assert kv_tokens_in('vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0') is None
    assert kv_tokens_in("vllm:num_requests_running 0\n") is None
