"""An upstream SIGKILLed mid-stream: the request goes on on another upstream of its
model from the text already sent, and the client's stream completes with exactly the
text a run without the kill gives — no error event, nothing repeated."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import httpx

from laneway.config import ServerConfig, WorkerConfig
from laneway.testing import StandInProcess
from live_server import live_server


def _upstream(name: str, url: str) -> WorkerConfig:
    return WorkerConfig(
        name, type="upstream", url=url, model="standin", served_name="m", slots=2, token_ids="vllm"
    )


def _stream(c: httpx.Client, url: str, on_chunk: object = None) -> tuple[str, str | None, list[str]]:
    body = {"model": "m", "prompt": "tell me", "max_tokens": 300, "stream": True, "temperature": 0}
    text, finish, workers = "", None, []
    with c.stream("POST", url, json=body) as r:
        assert r.status_code == 200
        for n, line in enumerate(r.iter_lines()):
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            for choice in chunk.get("choices", ()):
                text += choice.get("text") or ""
                finish = choice.get("finish_reason") or finish
            if "laneway" in chunk:
                workers.append(chunk["laneway"]["worker"])
            if callable(on_chunk):
                on_chunk(n)
    return text, finish, workers


def test_a_stream_goes_on_when_its_upstream_dies(tmp_path: Path) -> None:
    a = StandInProcess(tmp_path / "a.log", ("--slots", "2", "--ms-per-token", "5"))
    b = StandInProcess(tmp_path / "b.log", ("--slots", "2", "--ms-per-token", "5"))
    try:
        cfg = replace(
            ServerConfig(), workers=(_upstream("a", a.url), _upstream("b", b.url)), data_dir=tmp_path
        )
        with live_server(cfg) as server, httpx.Client(timeout=60) as c:
            url = server.base_url + "/completions"
            want, want_finish, _ = _stream(c, url)  # uninterrupted (on "a": idle longest first)
            assert len(want) > 100 and want_finish == "length"
            killed: list[float] = []

            def kill_mid_stream(n: int) -> None:
                if n == 20 and not killed:
                    busy = a if server.runtime.workers["a"].capacity().busy else b
                    busy.proc.kill()
                    killed.append(time.monotonic())

            got, finish, workers = _stream(c, url, kill_mid_stream)
            assert killed, "the stream ended before the kill"
            assert got == want and finish == "length"  # the same text, once
            assert len(workers) == 1  # (the last chunk names where it ended)
    finally:
        a.stop()
        b.stop()
