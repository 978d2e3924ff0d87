"""The stand-in engine (laneway.standin) behaves as vLLM does where laneway relies on it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from laneway.standin import StandIn
from laneway.standin_text import decode
from laneway.testing import StandInProcess
from live_server import serving


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[StandIn, str]]:
    app = StandIn("standin", slots=1, ms_per_token=5.0)
    with serving(app, "") as url:
        yield app, url


def events(url: str, body: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append("[DONE]" if line == "data: [DONE]" else json.loads(line[6:]))
    return out


def test_models_answers_and_usage(engine: tuple[StandIn, str]) -> None:
    _, url = engine
    assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "standin"
    r = httpx.post(
        url + "/v1/completions", json={"model": "standin", "prompt": "hi", "max_tokens": 6}, timeout=30
    )
    body = r.json()
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8}
    assert body["choices"][0]["finish_reason"] == "length" and len(body["choices"][0]["text"].split()) == 6
    bad = httpx.post(url + "/v1/completions", json={"model": "other", "prompt": "x"}, timeout=30)
    assert bad.status_code == 400 and "not served" in bad.json()["error"]["message"]


def test_a_stream_with_ids_resumes_exactly_from_them(engine: tuple[StandIn, str]) -> None:
    _, url = engine
    chat = {"model": "standin", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    got = events(
        url + "/v1/chat/completions",
        {**chat, "return_token_ids": True, "stream_options": {"include_usage": True}},
    )
    assert got[-1] == "[DONE]" and got[-2]["usage"]["completion_tokens"] == 10 and not got[-2]["choices"]
    assert got[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    prompt_ids = got[0]["prompt_token_ids"]
    ids = [t for c in got[1:-2] for t in c["choices"][0]["token_ids"]]
    text = "".join(c["choices"][0]["delta"]["content"] for c in got[1:-2])
    assert len(ids) == 10 and decode(ids) == text
    rest = httpx.post(
        url + "/v1/completions",
        json={"model": "standin", "prompt": prompt_ids + ids[:4], "max_tokens": 6},
        timeout=30,
    ).json()
    assert decode(ids[:4]) + rest["choices"][0]["text"] == text
    detok = httpx.post(url + "/detokenize", json={"tokens": ids}, timeout=30).json()
    assert detok["prompt"] == text


def test_slots_queue_in_order_and_a_client_that_leaves_frees_its_slot(engine: tuple[StandIn, str]) -> None:
    app, url = engine
    long = {"model": "standin", "prompt": "long", "max_tokens": 400}  # 2 s at 5 ms a token
    aborted = app.aborted
    with httpx.stream("POST", url + "/v1/completions", json={**long, "stream": True}, timeout=30) as r:
        next(r.iter_lines())  # it runs, holding the only slot
        t0 = time.monotonic()
    # it went away: the next request does not wait for the rest of it
    r = httpx.post(
        url + "/v1/completions", json={"model": "standin", "prompt": "next", "max_tokens": 2}, timeout=30
    )
    assert r.status_code == 200 and time.monotonic() - t0 < 1.0
    assert app.aborted == aborted + 1 and app.peak == 1
    ends: dict[str, float] = {}

    def run(name: str, tokens: int) -> None:
        httpx.post(
            url + "/v1/completions",
            json={"model": "standin", "prompt": name, "max_tokens": tokens},
            timeout=30,
        )
        ends[name] = time.monotonic()

    first = threading.Thread(target=run, args=("first", 60))  # 0.3 s at 5 ms a token
    first.start()
    time.sleep(0.05)
    sent = time.monotonic()
    second = threading.Thread(target=run, args=("second", 1))
    second.start()
    first.join(30)
    second.join(30)
    # a short one waits for the slot (a FIFO engine): ~0.25 s for the first's rest, not 5 ms for its token
    # (the two clients' threads may note their ends in either order, a few ms apart)
    assert ends["second"] - sent > 0.15 and set(ends) == {"first", "second"}


def test_stats_count_the_requests_open_at_once(engine: tuple[StandIn, str]) -> None:
    """One slot, three clients at once: two wait in its queue, all three are open."""
    _, url = engine
    before = httpx.get(url + "/stats").json()
    body = {"model": "standin", "prompt": "x", "max_tokens": 100}  # (0.5 s each: the three overlap)
    threads = [
        threading.Thread(
            target=httpx.post, args=(url + "/v1/completions",), kwargs={"json": body, "timeout": 30}
        )
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    stats = httpx.get(url + "/stats").json()
    assert stats["peak"] == 1 and stats["peak_requests"] == 3
    assert stats["served"] == before["served"] + 3


def test_a_request_sent_after_its_predecessor_was_dropped_is_not_counted_with_it() -> None:
    """A client that drops a stream and then sends the next request has one open at a time,
    and is counted so: a dropped stream is seen gone before the request after it counts."""
    app = StandIn("standin", slots=1, ms_per_token=5.0)
    with serving(app, "") as url, httpx.Client(timeout=30) as client:
        for i in range(20):
            body = {"model": "standin", "prompt": f"long {i}", "max_tokens": 500, "stream": True}
            with client.stream("POST", url + "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                assert next(lines).startswith("data: ")
            # (the stream is closed, unfinished: its connection is dropped)
            got = client.post(
                url + "/v1/completions", json={"model": "standin", "prompt": "x", "max_tokens": 1}
            )
            assert got.status_code == 200
        stats = client.get(url + "/stats").json()
    assert stats["aborted"] == 20 and stats["served"] == 20
    assert stats["peak_requests"] == 1, stats


def test_a_request_whose_client_leaves_while_it_waits_is_gone_from_the_queue_and_its_gauge() -> None:
    """Found failing: a whole (not streamed) request whose client left while it waited kept
    its handler waiting for tokens forever (and a SIGTERM then could not stop the engine),
    and the waiting gauge still counted it (laneway's saturation gate cut the engine again)."""
    app = StandIn("standin", slots=1, ms_per_token=5.0)
    with serving(app, "") as url:
        long = {"model": "standin", "prompt": "long", "max_tokens": 400, "stream": True}  # 2 s
        with httpx.stream("POST", url + "/v1/completions", json=long, timeout=30) as r:
            lines = r.iter_lines()  # (kept: a generator let go closes the response)
            next(lines)  # it holds the only slot
            for stream in (False, True):
                body = {"model": "standin", "prompt": "waits", "max_tokens": 4, "stream": stream}
                with (
                    pytest.raises(httpx.ReadTimeout),  # its client leaves while it waits
                    httpx.stream("POST", url + "/v1/completions", json=body, timeout=0.3) as w,
                ):
                    w.read()
            for _ in range(100):
                if not app.waiting and app.open_requests() == 1:
                    break
                time.sleep(0.02)
            metrics = httpx.get(url + "/metrics", timeout=5).text
            assert 'vllm:num_requests_waiting{model_name="standin"} 0' in metrics, metrics
            assert app.open_requests() == 1 and app.aborted == 2
        short = {"model": "standin", "prompt": "next", "max_tokens": 2}
        assert httpx.post(url + "/v1/completions", json=short, timeout=30).status_code == 200


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--slots", "0"], "argument --slots: must be at least 1, got 0"),
        (["--port", "70000"], "argument --port: must be 0–65535, got 70000"),
        (["--ms-per-token", "-1"], "argument --ms-per-token: must be a finite number >= 0, got '-1'"),
        (["--load-s", "inf"], "argument --load-s: must be a finite number >= 0, got 'inf'"),
    ],
)
def test_its_arguments_are_checked(args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    from laneway.standin import main

    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2 and capsys.readouterr().err == f"python -m laneway.standin: error: {says}\n"


def test_what_it_does_not_serve_is_refused_by_name(engine: tuple[StandIn, str]) -> None:
    _, url = engine
    for extra, says in (({"prompt": ["a", "b"]}, "one prompt"), ({"n": 3}, "one choice")):
        body = {"model": "standin", "prompt": "x", "max_tokens": 2, **extra}
        r = httpx.post(url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text


def test_stopped_it_ends_what_runs_at_once(tmp_path: Path) -> None:
    """SIGTERM while a long stream runs: the process ends within seconds (it waited for the
    stream to finish), the stream cut short (no [DONE]: its client sees a broken stream),
    a whole answer waiting behind it a 503."""
    engine = StandInProcess(tmp_path / "standin.log", ("--slots", "1", "--ms-per-token", "20"))
    got: dict[str, object] = {}

    def stream() -> None:
        body = {"model": "standin", "prompt": "x", "max_tokens": 3000, "stream": True}
        with httpx.stream("POST", engine.url + "/completions", json=body, timeout=60) as r:
            got["lines"] = [line for line in r.iter_lines() if line]

    def whole() -> None:
        body = {"model": "standin", "prompt": "y", "max_tokens": 3}
        got["whole"] = httpx.post(engine.url + "/completions", json=body, timeout=60).status_code

    try:
        clients = [threading.Thread(target=stream), threading.Thread(target=whole)]
        for t in clients:
            t.start()
            time.sleep(0.3)
        t0 = time.monotonic()
        engine.proc.terminate()
        engine.proc.wait(30)
        took = time.monotonic() - t0
        for t in clients:
            t.join(30)
    finally:
        engine.stop()
    assert took < 10, took  # (the stream alone had 60 s to go)
    lines = got["lines"]
    assert isinstance(lines, list) and lines and "data: [DONE]" not in lines
    assert got["whole"] == 503
    assert "Traceback" not in (tmp_path / "standin.log").read_text()


def test_it_ends_at_its_context_and_refuses_a_prompt_over_it(
    engine: tuple[StandIn, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As vLLM: a max_tokens past the context ends there ("length"), a prompt over it is a 400."""
    _, url = engine
    monkeypatch.setattr("laneway.standin.MAX_MODEL_LEN", 12)
    body = {"model": "standin", "prompt": "hi", "max_tokens": 100_000}
    r = httpx.post(url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 10, r.text
    assert r.json()["choices"][0]["finish_reason"] == "length"
    long = httpx.post(url + "/v1/completions", json={**body, "prompt": "x" * 12}, timeout=30)
    assert long.status_code == 400 and "over the context of 12" in long.json()["error"]["message"], long.text
