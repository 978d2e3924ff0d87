"""The upstream worker against a real OpenAI-compatible server: a second ``laneway serve``."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import openai
import pytest

from laneway.backends.base import Worker, stream
from laneway.backends.upstream import UpstreamUnavailable, UpstreamWorker
from laneway.config import ServerConfig, WorkerConfig
from laneway.errors import InvalidRequest, ModelNotFound
from laneway.generation import Delta, Done, Event, Failed, Job, SamplingParams, Stopped
from laneway.testing import serve_process
from live_server import live_server

MODEL = "builtin:tiny"
GREEDY = SamplingParams(max_tokens=60, temperature=0.0)
CHAT = ({"role": "user", "content": "tell me a story"},)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A laneway server with the in-process engine (2 slots): its ``/v1`` URL."""
    data: Path = tmp_path_factory.mktemp("upstream")
    with serve_process(
        "--model", MODEL, "--slots", "2", "--data-dir", str(data), log=data / "serve.log"
    ) as server:
        yield server.url + "/v1"


def direct(upstream: str, path: str, body: dict) -> dict:
    r = httpx.post(f"{upstream}/{path}", json={"model": MODEL, "temperature": 0, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once closed


async def collect(worker: Worker, job: Job) -> list[Event]:
    return [e async for e in stream(worker, job)]


def test_completion_and_chat_match_the_upstream(upstream: str) -> None:
    ref_c = direct(upstream, "completions", {"prompt": "hello", "max_tokens": 60})
    ref_chat = direct(upstream, "chat/completions", {"messages": list(CHAT), "max_tokens": 60})

    async def main() -> None:
        worker = UpstreamWorker("up", upstream, MODEL, slots=2, token_ids="none")
        try:
            assert (await worker.health()).ok
            events = await collect(worker, Job("c", MODEL, GREEDY, prompt="hello"))
            done = events[-1]
            assert isinstance(done, Done)
            assert done.text == ref_c["choices"][0]["text"] == "".join(e.text for e in events[:-1])  # type: ignore[union-attr]
            assert done.usage.completion_tokens == ref_c["usage"]["completion_tokens"]
            assert done.usage.prompt_tokens == ref_c["usage"]["prompt_tokens"]
            events = await collect(worker, Job("m", MODEL, GREEDY, messages=CHAT))
            assert isinstance(events[-1], Done)
            assert events[-1].text == ref_chat["choices"][0]["message"]["content"]
            assert worker.capacity().busy == 0
        finally:
            await worker.close()

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_preempt_then_resume_by_recompute_gives_the_same_text(upstream: str, kind: str) -> None:
    if kind == "chat":
        job = Job("p", MODEL, GREEDY, messages=CHAT)
        ref = direct(upstream, "chat/completions", {"messages": list(CHAT), "max_tokens": 60})
        ref_text = ref["choices"][0]["message"]["content"]
    else:
        job = Job("p", MODEL, GREEDY, prompt="resume me")
        ref_text = direct(upstream, "completions", {"prompt": "resume me", "max_tokens": 60})["choices"][0][
            "text"
        ]

    async def main() -> None:
        worker = UpstreamWorker("up", upstream, MODEL, slots=1, token_ids="none")
        events: asyncio.Queue[Event] = asyncio.Queue()
        try:
            await worker.run(job, events.put_nowait)
            seen: list[Event] = []
            while len([e for e in seen if isinstance(e, Delta) and e.text]) < 5:  # chat: a role chunk first
                seen.append(await asyncio.wait_for(events.get(), 30))
            await worker.preempt("p", "recompute")
            while not isinstance(ev := await asyncio.wait_for(events.get(), 30), Stopped):
                seen.append(ev)
            ckpt = ev.checkpoint
            assert ckpt.mode == "text" and worker.capacity().busy == 0  # laneway here gives no token ids
            assert ckpt.text_so_far == "".join(e.text for e in seen if isinstance(e, Delta))
            assert 5 <= ckpt.tokens_done < 60
            await worker.resume(ckpt, events.put_nowait)
            while not isinstance(ev := await asyncio.wait_for(events.get(), 30), Done):
                seen.append(ev)
            assert ev.text == ref_text
            assert "".join(e.text for e in seen if isinstance(e, Delta)) == ref_text  # nothing sent twice
            assert ev.usage.completion_tokens == 60
        finally:
            await worker.close()

    asyncio.run(main())


def test_upstream_errors_become_client_errors(upstream: str) -> None:
    async def failure(worker: UpstreamWorker, job: Job) -> Exception:
        events = await collect(worker, job)
        assert len(events) == 1 and isinstance(events[0], Failed), events
        return events[0].error

    async def main() -> None:
        wrong_model = UpstreamWorker("up", upstream, "no-such-model", token_ids="none")
        good = UpstreamWorker("up", upstream, MODEL, token_ids="none")
        dead = UpstreamWorker(
            "gone", f"http://127.0.0.1:{dead_port()}/v1", MODEL, timeout_s=5, token_ids="none"
        )
        try:
            err = await failure(wrong_model, Job("a", MODEL, GREEDY, prompt="x"))
            assert isinstance(err, ModelNotFound) and "no-such-model" in str(err)
            err = await failure(good, Job("b", MODEL, GREEDY, prompt="x" * 5000))
            assert isinstance(err, InvalidRequest) and err.status == 400 and "prompt" in str(err)
            too_many = SamplingParams(max_tokens=5000, temperature=0.0)
            err = await failure(good, Job("b2", MODEL, too_many, prompt="x"))
            assert isinstance(err, InvalidRequest) and "lower max_tokens" in str(err)
            err = await failure(dead, Job("c", MODEL, GREEDY, prompt="x"))
            assert isinstance(err, UpstreamUnavailable) and err.retryable
            assert not (await dead.health()).ok
            for w in (wrong_model, good, dead):
                assert w.capacity().busy == 0
        finally:
            for w in (wrong_model, good, dead):
                await w.close()

    asyncio.run(main())


@pytest.mark.parametrize(("token_ids", "resume"), [("vllm", "token_ids"), ("none", "text")])
def test_gateway_in_front_of_an_upstream_preempts_and_resumes(
    upstream: str, tmp_path: Path, token_ids: str, resume: str
) -> None:
    """1 upstream slot: a P3 runs, a P0 arrives and is answered first; the P3's text is unchanged,
    resumed from its token ids (a laneway upstream gives them, as vLLM does) or from its text."""
    worker = WorkerConfig(
        "up", type="upstream", url=upstream, model=MODEL, served_name="tiny", slots=1, token_ids=token_ids
    )
    cfg = replace(ServerConfig(), workers=(worker,), data_dir=tmp_path)
    with (
        live_server(cfg) as server,
        openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120) as c,
    ):

        def p3() -> openai.types.Completion:
            return c.completions.create(
                model="tiny", prompt="long", max_tokens=100, temperature=0, extra_body={"priority": "P3"}
            )

        alone = p3()
        result: list[openai.types.Completion] = []
        ended: list[float] = []
        t = threading.Thread(target=lambda: (result.append(p3()), ended.append(time.monotonic())))
        t.start()
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if any(tk.tokens >= 5 for tk in list(server.runtime.tickets.values())):
                    break
                time.sleep(0.005)
            p0 = c.chat.completions.create(
                model="tiny", messages=list(CHAT), max_tokens=5, temperature=0, extra_body={"priority": "P0"}
            )
            p0_done = time.monotonic()
        finally:
            t.join(120)
        assert p0.model_extra["laneway"]["worker"] == "up"
        [resumed] = result
        assert p0_done < ended[0]
        assert resumed.model_extra["laneway"]["preemptions"] >= 1
        assert resumed.model_extra["laneway"]["resume"] == resume
        assert resumed.choices[0].text == alone.choices[0].text
        assert resumed.usage.completion_tokens == 100


def test_gateway_retries_on_another_worker_and_maps_upstream_errors(upstream: str, tmp_path: Path) -> None:
    gone = f"http://127.0.0.1:{dead_port()}/v1"
    dead = WorkerConfig(
        "dead", type="upstream", url=gone, model=MODEL, served_name="tiny", slots=1, token_ids="none"
    )
    alive = WorkerConfig(
        "up", type="upstream", url=upstream, model=MODEL, served_name="tiny", slots=1, token_ids="none"
    )
    cfg = replace(ServerConfig(), workers=(dead, alive), data_dir=tmp_path)
    with (
        live_server(cfg) as server,
        openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60) as c,
    ):
        for i in range(3):
            out = c.completions.create(model="tiny", prompt=f"retry {i}", max_tokens=5, temperature=0)
            assert out.model_extra["laneway"]["worker"] == "up"
            assert out.usage.completion_tokens == 5
        assert server.runtime.recovery.down == {"dead"}
        # the upstream's own refusal reaches the client as that error, not as a 5xx
        r = httpx.post(
            server.base_url + "/completions",
            json={"model": "tiny", "prompt": "x" * 5000, "max_tokens": 5},
            timeout=60,
        )
        assert r.status_code == 400, r.text
        assert "prompt" in r.json()["error"]["message"]
