"""An upstream SIGKILLed mid-stream: the request goes on on another upstream of its
model from the text already sent, and the client's stream completes with exactly the
text a run without the kill gives — no error event, nothing repeated."""

from __future__ import annotations

import json
import threading
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


def test_a_chat_that_went_on_elsewhere_is_still_answered_as_a_chat(tmp_path: Path) -> None:
    """Found failing: a chat resumed on another upstream goes on through its /completions
    (by token ids); the whole answer came back as a ``text_completion``, its usage chunk
    too, with the continuation's ``prompt_token_ids`` in its choices. (Three upstreams: one
    is killed under a whole answer, another under a stream.)"""
    engines = {
        name: StandInProcess(tmp_path / f"{name}.log", ("--slots", "2", "--ms-per-token", "5"))
        for name in ("a", "b", "c")
    }
    try:
        workers = tuple(_upstream(name, e.url) for name, e in engines.items())
        cfg = replace(ServerConfig(), workers=workers, data_dir=tmp_path)
        with live_server(cfg) as server, httpx.Client(timeout=60) as c:
            url = server.base_url + "/chat/completions"
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": "tell me"}],
                "max_tokens": 300,
                "temperature": 0,
            }
            want = c.post(url, json=body).json()["choices"][0]["message"]["content"]
            for stream in (False, True):
                killed: list[str] = []

                def kill_the_busy_one(killed: list[str]) -> None:
                    for _ in range(500):
                        busy = [n for n in engines if server.runtime.workers[n].capacity().busy]
                        if busy:
                            time.sleep(0.4)  # (a part of its answer made)
                            engines[busy[0]].proc.kill()
                            killed.append(busy[0])
                            return
                        time.sleep(0.01)

                killer = threading.Thread(target=kill_the_busy_one, args=(killed,))
                killer.start()
                if stream:
                    asked = {**body, "stream": True, "stream_options": {"include_usage": True}}
                    with c.stream("POST", url, json=asked) as r:
                        chunks = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
                    said = [ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"]]
                    text = "".join(said)
                    assert {ch["object"] for ch in chunks} == {"chat.completion.chunk"}, chunks[-3:]
                    assert chunks[-1]["usage"]["completion_tokens"] == 300
                    assert not any("prompt_token_ids" in one for ch in chunks for one in ch["choices"])
                    resume = next(ch["laneway"]["resume"] for ch in reversed(chunks) if "laneway" in ch)
                else:
                    answer = c.post(url, json=body).json()
                    assert answer["object"] == "chat.completion", answer
                    assert "prompt_token_ids" not in answer["choices"][0], answer["choices"][0]
                    text = answer["choices"][0]["message"]["content"]
                    resume = answer["laneway"]["resume"]
                killer.join(30)
                assert killed, "nothing was running to kill"
                assert text == want and resume == "token_ids"  # the same answer, gone on by its ids
    finally:
        for e in engines.values():
            e.stop()
