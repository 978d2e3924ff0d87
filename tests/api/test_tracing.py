"""OpenTelemetry traces, sent to a real OTLP/HTTP receiver on loopback: a span per request in
the client's trace (its traceparent), with its class, tenant, time queued and outcome, an
event per preemption, a child span per run on a worker; none of it without an endpoint."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from laneway.config import ServerConfig
from live_server import live_server, serving, simulated, tiny, upstream
from otlp_receiver import Receiver, otlp_receiver

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
OTHER = "5cf92f3577b34da6a3ce929d0e0e4737"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as r:
        yield r


def test_a_preempted_request_is_one_span_in_the_clients_trace(tmp_path: Path, receiver: Receiver) -> None:
    cfg = replace(ServerConfig(), workers=(tiny(1),), data_dir=tmp_path, otlp_traces_endpoint=receiver.url)
    low = {"model": "builtin:tiny", "prompt": "long", "max_tokens": 100, "temperature": 0, "priority": "P3"}
    with live_server(cfg) as s:
        out: list[Any] = []

        def p3() -> None:
            headers = {"traceparent": f"00-{TRACE}-{PARENT}-01"}
            out.append(httpx.post(s.base_url + "/completions", json=low, headers=headers, timeout=120))

        t = threading.Thread(target=p3)
        t.start()
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not any(
                tk.tokens >= 5 for tk in list(s.runtime.tickets.values())
            ):
                time.sleep(0.005)
            urgent = {
                "model": "builtin:tiny",
                "messages": [{"role": "user", "content": "now"}],
                "max_tokens": 3,
            }
            p0 = httpx.post(s.base_url + "/chat/completions", json={**urgent, "priority": "P0"}, timeout=60)
        finally:
            t.join(120)
        assert p0.status_code == 200 and out[0].status_code == 200
        assert out[0].json()["laneway"]["preemptions"] >= 1
    # (the server flushed its spans as it stopped)
    spans = receiver.of_trace(TRACE)
    [request] = [x for x in spans if x.name == "laneway.request"]
    runs = [x for x in spans if x.name == "laneway.run"]
    assert request.service == "laneway" and request.parent_id == PARENT  # the client's trace goes on
    a = request.attributes
    assert (a["laneway.priority"], a["laneway.kind"], a["laneway.model"]) == (
        "P3",
        "completion",
        "builtin:tiny",
    )
    assert a["laneway.outcome"] == "completed" and a["laneway.preemptions"] >= 1
    assert a["laneway.queue_s"] >= 0 and a["laneway.completion_tokens"] == 100 and a["laneway.worker"] == "w0"
    assert [name for name, _ in request.events].count("preempted") == a["laneway.preemptions"]
    assert len(runs) == a["laneway.preemptions"] + 1 and all(r.parent_id == request.span_id for r in runs)
    ends = sorted(
        (r.attributes["laneway.run"], r.attributes["laneway.run_end"], r.attributes["laneway.resumed"])
        for r in runs
    )
    assert ends[0][1:] == ("preempted", False) and ends[-1][1:] == ("completed", True)
    # the P0 had no traceparent: a trace of its own
    others = [x for x in receiver.spans if x.name == "laneway.request" and x.trace_id != TRACE]
    assert [x.attributes["laneway.priority"] for x in others] == ["P0"] and others[0].parent_id == ""


def test_a_refused_request_ends_its_span_with_an_error(tmp_path: Path, receiver: Receiver) -> None:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def models(request: object) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def refuse(request: object) -> JSONResponse:  # (what only the engine knows)
        return JSONResponse({"error": {"message": "no such adapter", "param": "lora"}}, status_code=400)

    app = Starlette(routes=[Route("/v1/models", models), Route("/v1/completions", refuse, methods=["POST"])])
    with serving(app) as url:
        cfg = replace(
            ServerConfig(),
            workers=(tiny(1), upstream("up", url)),
            data_dir=tmp_path,
            otlp_traces_endpoint=receiver.url,
        )
        with live_server(cfg) as s, httpx.Client(base_url=s.base_url, timeout=60) as c:
            # past the tiny context: refused as it arrives (README: such a request has no span)
            body = {"model": "builtin:tiny", "prompt": "x" * 10_000, "max_tokens": 3}
            r = c.post("/completions", json=body, headers={"traceparent": f"00-{OTHER}-{PARENT}-01"})
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
            body = {"model": "m", "prompt": "y", "max_tokens": 3}
            r = c.post("/completions", json=body, headers={"traceparent": f"00-{TRACE}-{PARENT}-01"})
            assert r.status_code == 400 and "no such adapter" in r.text, r.text
    spans = receiver.of_trace(TRACE)
    assert spans, "no span was sent"
    [request] = [x for x in spans if x.name == "laneway.request"]
    assert request.error and request.attributes["laneway.outcome"] == "rejected"  # (the engine refused it)
    assert receiver.of_trace(OTHER) == []


def test_without_an_endpoint_nothing_of_opentelemetry_is_imported() -> None:
    code = (
        "import sys, laneway.server, laneway.api;"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_bad_endpoint_is_a_clear_error() -> None:
    from laneway.config import parse_config
    from laneway.core.errors import ConfigError

    with pytest.raises(ConfigError, match="otlp_traces_endpoint: an OTLP/HTTP URL"):
        parse_config({"server": {"otlp_traces_endpoint": "127.0.0.1:4318"}})


def test_a_response_is_traced_under_the_id_its_client_holds(tmp_path: Path, receiver: Receiver) -> None:
    cfg = replace(ServerConfig(), workers=(tiny(1),), data_dir=tmp_path, otlp_traces_endpoint=receiver.url)
    with live_server(cfg) as s:
        body = {"model": "builtin:tiny", "input": "Hi", "max_output_tokens": 3}
        r = httpx.post(
            s.base_url + "/responses", json=body, headers={"traceparent": f"00-{TRACE}-{PARENT}-01"}
        )
        assert r.status_code == 200
    [request] = [x for x in receiver.of_trace(TRACE) if x.name == "laneway.request"]
    assert request.attributes["laneway.request_id"] == r.json()["id"]


def test_a_request_refused_as_it_arrives_by_a_quota_is_a_span_too(tmp_path: Path, receiver: Receiver) -> None:
    """A 429 (or a 503 of a queue bound) is the refusal of a request laneway read and
    weighed: a span ended rejected, as one refused after it queued (it had none)."""
    from laneway.config import hash_key, parse_config

    quota = {"P1": {"rate_per_s": 0.01, "burst": 1}}
    base = parse_config({"tenants": {"t": {"key_sha256": [hash_key("k")], "quotas": quota}}})
    cfg = replace(base, workers=(tiny(1),), data_dir=tmp_path, otlp_traces_endpoint=receiver.url)
    with live_server(cfg) as s, httpx.Client(base_url=s.base_url, timeout=60) as c:
        body = {"model": "builtin:tiny", "prompt": "x", "max_tokens": 2, "priority": "P1"}
        headers = {"Authorization": "Bearer k"}
        assert c.post("/completions", json=body, headers=headers).status_code == 200
        headers["traceparent"] = f"00-{TRACE}-{PARENT}-01"
        r = c.post("/completions", json=body, headers=headers)
        assert r.status_code == 429, r.text
    [request] = [x for x in receiver.of_trace(TRACE) if x.name == "laneway.request"]
    a = request.attributes
    assert request.error and a["laneway.outcome"] == "rejected" and a["laneway.tenant"] == "t"
    assert request.parent_id == PARENT


def test_a_collector_that_never_answers_does_not_hold_a_stopping_server(tmp_path: Path) -> None:
    """Spans are flushed as the server stops; a collector that accepts and never answers
    costs that flush its bounded export time, not the SDK's 30 s (an orchestrator's grace
    is spent by then, and the server killed)."""
    import socket

    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def swallow() -> None:
        hole.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(hole.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=swallow, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{hole.getsockname()[1]}/v1/traces"
        cfg = replace(ServerConfig(), workers=(tiny(1),), data_dir=tmp_path, otlp_traces_endpoint=url)
        with live_server(cfg) as s, httpx.Client(base_url=s.base_url, timeout=60) as c:
            for _ in range(20):
                body = {"model": "builtin:tiny", "prompt": "hi", "max_tokens": 2}
                assert c.post("/completions", json=body).status_code == 200
            t0 = time.monotonic()
        took = time.monotonic() - t0
        assert took < 8.5, took  # (an export waits 5 s at most; the SDK alone: 10 s each, 30 s in all)
    finally:
        stop.set()
        thread.join(5)
        for conn in accepted:
            conn.close()
        hole.close()


def test_a_cancelled_stream_is_not_an_error_and_the_clients_tracestate_is_kept(
    tmp_path: Path, receiver: Receiver
) -> None:
    """A client that closes its stream cancelled the request: its span says so (outcome,
    the tokens it had), with no error status — errors are the server's. The client's
    ``tracestate`` goes on with its trace."""
    cfg = replace(
        ServerConfig(), workers=(simulated(1, 50.0),), data_dir=tmp_path, otlp_traces_endpoint=receiver.url
    )
    headers = {"traceparent": f"00-{TRACE}-{PARENT}-01", "tracestate": "congo=t61rcWkgMzE"}
    body = {"model": "sim", "prompt": "go", "max_tokens": 500, "stream": True}
    with live_server(cfg) as s:
        with httpx.stream("POST", s.base_url + "/completions", json=body, headers=headers, timeout=60) as r:
            got = 0
            for line in r.iter_lines():
                got += line.startswith("data: {")
                if got >= 5:
                    break  # (the client goes away mid-stream)
        deadline = time.monotonic() + 30
        while s.runtime.tickets and time.monotonic() < deadline:
            time.sleep(0.05)
        spans = receiver.wait_for(TRACE, {"laneway.request"})
    [request] = [x for x in spans if x.name == "laneway.request"]
    assert request.attributes["laneway.outcome"] == "cancelled"
    assert not request.error
    assert request.attributes["laneway.completion_tokens"] >= 5
    assert request.trace_state == "congo=t61rcWkgMzE"
