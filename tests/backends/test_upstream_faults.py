"""Whose failure is it? An upstream that answers 500 to one request is up: that request
fails (once: it is not tried again), the worker stays in placement for everyone else. One that
answers 503 (or cannot be reached) is out until a probe finds it well again. A run that
takes longer than the worker's ``timeout_s`` is the request's: a 504, not tried on the
other worker, and both stay in placement."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from laneway.config import ServerConfig, parse_config
from live_server import live_server, serving, upstream


def fake_upstream(calls: list[str], bodies: list[dict] | None = None) -> Starlette:
    """An OpenAI-like server of one model: prompts holding "poison" get a 500, "busy" a 503,
    "slow" a first chunk and then nothing more for 30 s."""

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def completions(request: Request) -> Response:
        body = json.loads(await request.body())
        prompt = str(body.get("prompt"))
        calls.append(prompt)
        if bodies is not None:
            bodies.append(body)
        if "poison" in prompt:
            return JSONResponse({"error": {"message": "the engine choked on it"}}, status_code=500)
        if "busy" in prompt:
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)

        async def chunks() -> AsyncIterator[bytes]:
            for word in ("a", " b"):
                if "slow" in prompt and word == " b":
                    await asyncio.sleep(30)
                chunk = {
                    "id": "c",
                    "object": "text_completion",
                    "created": 0,
                    "model": "m",
                    "choices": [{"index": 0, "text": word, "finish_reason": None, "logprobs": None}],
                }
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            last = {
                "id": "c",
                "object": "text_completion",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "text": "", "finish_reason": "length", "logprobs": None}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
            }
            yield f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode()

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return Starlette(
        routes=[Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"])]
    )


def test_a_500_fails_its_request_only_and_a_503_takes_the_worker_out(tmp_path: Path) -> None:
    calls: list[str] = []
    with serving(fake_upstream(calls)) as url:
        worker = upstream("up", url, slots=2)
        cfg = replace(ServerConfig(), workers=(worker,), data_dir=tmp_path, probe_interval_s=60.0)
        with live_server(cfg) as server, httpx.Client(base_url=server.base_url, timeout=30) as c:
            ok = {"model": "m", "prompt": "fine", "max_tokens": 2}
            assert c.post("/completions", json=ok).status_code == 200
            r = c.post("/completions", json={**ok, "prompt": "poison"})
            assert r.status_code == 502 and "choked" in r.json()["error"]["message"]
            assert server.runtime.recovery.down == set()  # it answered: it is up
            assert calls.count("poison") == 1  # (the engine would fail it again: sent once)
            r = c.post("/embeddings", json={"model": "m", "input": "x"})  # a route it lacks
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
            assert "does not serve POST /embeddings" in r.json()["error"]["message"]
            assert server.runtime.recovery.down == set()
            for _ in range(3):  # and serves the next ones at once
                assert c.post("/completions", json=ok).status_code == 200
            r = c.post("/completions", json={**ok, "prompt": "busy"})
            assert r.status_code == 503
            assert server.runtime.recovery.down == {"up"}  # out until a probe (60 s here)


def test_a_run_past_timeout_s_is_a_504_and_leaves_its_worker_in_placement(tmp_path: Path) -> None:
    calls: list[str] = []
    with serving(fake_upstream(calls)) as url:
        workers = tuple(upstream(name, url, timeout_s=0.5, stall_timeout_s=60.0) for name in ("a", "b"))
        cfg = replace(ServerConfig(), workers=workers, data_dir=tmp_path, probe_interval_s=60.0)
        with live_server(cfg) as server, httpx.Client(base_url=server.base_url, timeout=30) as c:
            r = c.post("/completions", json={"model": "m", "prompt": "slow", "max_tokens": 2})
            assert r.status_code == 504, r.text
            error = r.json()["error"]
            assert error["code"] == "upstream_timeout" and "within 0.5 s" in error["message"], error
            assert r.headers["x-should-retry"] == "false"  # (OpenAI's clients would retry a 504)
            assert calls == ["slow"]  # not tried on the other worker: it would take as long
            assert server.runtime.recovery.down == set()  # slow is not gone
            with c.stream(
                "POST", "/completions", json={"model": "m", "prompt": "slow", "max_tokens": 2, "stream": True}
            ) as s:
                assert s.status_code == 200  # its first chunk came in time; the rest did not
                text = s.read().decode()
            assert '"text":"a"' in text.replace(" ", "") and "upstream_timeout" in text, text
            assert calls == ["slow", "slow"] and server.runtime.recovery.down == set()
            ok = {"model": "m", "prompt": "fine", "max_tokens": 2}
            for _ in range(2):
                assert c.post("/completions", json=ok).status_code == 200
            assert server.runtime.workers["a"].capacity().busy == 0
            assert server.runtime.workers["b"].capacity().busy == 0


def test_a_workers_x_keys_are_body_fields_by_their_own_name_and_the_clients_win(tmp_path: Path) -> None:
    calls: list[str] = []
    bodies: list[dict] = []
    with serving(fake_upstream(calls, bodies)) as url:
        (worker,) = parse_config(
            {"workers": [{"type": "upstream", "model": "m", "url": url, "x_top_k": 5, "x_min_p": 0.1}]}
        ).workers
        cfg = replace(ServerConfig(), workers=(worker,), data_dir=tmp_path)
        with live_server(cfg) as server, httpx.Client(base_url=server.base_url, timeout=30) as c:
            ok = {"model": "m", "prompt": "fine", "max_tokens": 2}
            assert c.post("/completions", json=ok).status_code == 200
            assert c.post("/completions", json={**ok, "top_k": 9}).status_code == 200
    assert (bodies[0]["top_k"], bodies[0]["min_p"], bodies[1]["top_k"], bodies[1]["min_p"]) == (
        5,
        0.1,
        9,
        0.1,
    )
    assert not any(k.startswith("x_") for b in bodies for k in b)  # (they were sent as x_top_k)


def freezing_upstream(thaw: threading.Event) -> Starlette:
    """An engine of model ``m`` that freezes at its first request: that request's answer
    begins and sends nothing more, and its ``/models`` answers no probe, until ``thaw``."""
    frozen = threading.Event()

    async def wait() -> None:
        for _ in range(600):  # (30 s at most)
            if thaw.is_set():
                return
            await asyncio.sleep(0.05)

    async def models(request: Request) -> Response:
        if frozen.is_set():
            await wait()
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def completions(request: Request) -> Response:
        frozen.set()

        async def nothing() -> AsyncIterator[bytes]:
            await wait()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(nothing(), media_type="text/event-stream")

    return Starlette(
        routes=[Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"])]
    )


def test_a_request_whose_engine_froze_before_it_made_anything_waits_its_queue_timeout_anew(
    tmp_path: Path,
) -> None:
    """Its run stalled (no event for ``stall_timeout_s``) and its worker is out: queued again,
    it waits its class's queue timeout from then, and gets the 503 ``queue_timeout`` any
    request queued too long gets — not an answer that never comes (``unavailable_hold_s``
    longer than the timeout here, as a fleet's models have none)."""
    thaw = threading.Event()
    try:
        with serving(freezing_upstream(thaw)) as url:
            cfg = parse_config(
                {
                    "server": {"data_dir": str(tmp_path), "probe_interval_s": 0.5, "unavailable_hold_s": 100},
                    "classes": {"P1": {"timeout_s": 2}},
                    "workers": [
                        {"name": "up", "type": "upstream", "model": "m", "url": url, "stall_timeout_s": 1}
                    ],
                }
            )
            with live_server(cfg) as server, httpx.Client(base_url=server.base_url, timeout=30) as c:
                t0 = time.monotonic()
                body = {"model": "m", "prompt": "hi", "max_tokens": 2, "priority": "P1"}
                r = c.post("/completions", json=body)
                took = time.monotonic() - t0
                assert r.status_code == 503 and r.json()["error"]["code"] == "queue_timeout", r.text
                assert 2.9 < took < 15.0  # (the stall, then the timeout from then)
                assert server.runtime.recovery.down == {"up"}
                assert server.runtime.sched.live == 0 and not server.runtime.tickets
                thaw.set()  # (its engine answers again: the server stops without waiting on it)
    finally:
        thaw.set()


def test_a_run_that_never_reached_its_worker_spends_no_try(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker whose engine went between two probes (no connection can be made): a run sent
    to it never reached it, and is tried again without spending a try or a migration (a
    request cut by an engine's death went back to the dead engine and spent its migrations
    there: the next failure ended it, a healthy engine beside it)."""
    calls: list[str] = []
    with serving(fake_upstream(calls)) as url, ExitStack() as gone:
        dead_url = gone.enter_context(serving(fake_upstream(calls)))
        workers = (upstream("dead", dead_url, slots=2), upstream("live", url, slots=2))
        cfg = replace(ServerConfig(), workers=workers, data_dir=tmp_path, probe_interval_s=60.0)
        with live_server(cfg) as server, httpx.Client(base_url=server.base_url, timeout=30) as c:
            gone.close()  # (the next probe is a minute away: "dead" is still in placement)
            with caplog.at_level(logging.WARNING, logger="laneway.runtime"):
                for i in range(4):
                    r = c.post("/completions", json={"model": "m", "prompt": f"fine {i}", "max_tokens": 2})
                    assert r.status_code == 200 and r.json()["laneway"]["worker"] == "live", r.text
            said = [rec.getMessage() for rec in caplog.records]
            assert any("did not reach worker dead" in m for m in said), said
            assert not any("retrying" in m for m in said), said
            assert server.runtime.recovery.down == {"dead"}
