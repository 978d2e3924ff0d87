"""One trace across laneway and a real vLLM: laneway's request and run spans, and vLLM's own
span of the same request (vLLM started with ``--otlp-traces-endpoint``), all sent to one
OTLP/HTTP receiver on loopback, vLLM's span a child of laneway's run."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from laneway.testing import VllmProcess, vllm_process
from live_server import live_server
from otlp_receiver import Receiver, otlp_receiver
from vllm_helpers import upstream_config

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as r:
        yield r


@pytest.fixture(scope="module")
def traced_vllm(
    vllm_paths: tuple[Path, Path], receiver: Receiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmProcess]:
    venv, model = vllm_paths
    log = tmp_path_factory.mktemp("traced-vllm") / "vllm.log"
    env = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "200"}
    with vllm_process(venv, model, log, "--otlp-traces-endpoint", receiver.url, cpus="1", env=env) as server:
        yield server


def test_one_trace_spans_laneway_and_vllm(
    traced_vllm: VllmProcess, receiver: Receiver, tmp_path: Path
) -> None:
    cfg = replace(upstream_config(tmp_path, traced_vllm.url, slots=1), otlp_traces_endpoint=receiver.url)
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 5,
        "priority": "P2",
    }
    with live_server(cfg) as s:
        r = httpx.post(
            s.base_url + "/chat/completions",
            json=body,
            headers={"traceparent": f"00-{TRACE}-{PARENT}-01"},
            timeout=120,
        )
        assert r.status_code == 200, r.text
    spans = receiver.wait_for(TRACE, {"laneway.request", "laneway.run", "llm_request"})
    by_name = {x.name: x for x in spans}
    assert {"laneway.request", "laneway.run", "llm_request"} <= set(by_name), [
        (x.service, x.name) for x in spans
    ]
    request, run, engine = by_name["laneway.request"], by_name["laneway.run"], by_name["llm_request"]
    assert request.parent_id == PARENT and run.parent_id == request.span_id
    assert engine.parent_id == run.span_id  # vLLM's span continues laneway's run: one trace
    assert request.service == "laneway" and engine.service != "laneway"
    assert request.attributes["laneway.priority"] == "P2" and run.attributes["laneway.worker"] == "v0"
