"""Anthropic's Messages API, and any other endpoint of vLLM's server that names a model,
through laneway with Anthropic's own client: scheduled by class, passed through as sent,
vLLM's answer (whole, or event by event) as vLLM gives it directly."""

from __future__ import annotations

import time
from typing import Any

import anthropic
import httpx
import pytest

from laneway.runtime.ticket import Phase
from laneway.testing import VllmProcess
from live_server import LiveServer, overtaken

TIMEOUT_S = 120
HELLO = [{"role": "user", "content": "Hello"}]


def client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=url.removesuffix("/v1"), api_key="unused", max_retries=0, timeout=TIMEOUT_S
    )


def preemptions(server: LiveServer) -> float:
    return float(server.runtime.metrics.preempted["P3"]._value.get())  # type: ignore[attr-defined]


def test_messages_are_vllms_own_whole_and_streamed(vllm: VllmProcess, gateway: LiveServer) -> None:
    via, direct = client(gateway.url), client(vllm.url)
    ask: dict[str, Any] = {
        "model": "tiny",
        "max_tokens": 10,
        "messages": HELLO,
        "extra_body": {"temperature": 0},
    }
    got, ref = via.messages.create(**ask), direct.messages.create(**ask)
    assert got.content == ref.content and got.usage == ref.usage and got.stop_reason == ref.stop_reason
    with via.messages.stream(**ask) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == ref.content[0].text  # type: ignore[union-attr]
    assert final.usage.output_tokens == ref.usage.output_tokens
    counted = via.messages.count_tokens(model="tiny", messages=HELLO)  # type: ignore[arg-type]
    assert counted.input_tokens == direct.messages.count_tokens(model="tiny", messages=HELLO).input_tokens  # type: ignore[arg-type]
    # a path vLLM does not serve: its 404, said so; one laneway serves with other methods: 405
    r = httpx.post(gateway.base_url + "/rerank", json={"model": "tiny", "query": "q", "documents": ["d"]})
    assert r.status_code == 404 and "does not serve POST /rerank" in r.json()["error"]["message"]
    r = httpx.post(gateway.base_url + "/responses/input_tokens", json={"model": "tiny", "input": "Hello"})
    assert r.status_code == 404, r.text  # (not 405: the path is no response's id)
    assert "does not serve POST /responses/input_tokens" in r.json()["error"]["message"]
    r = httpx.post(gateway.base_url + "/models", json={"model": "tiny"})
    assert r.status_code == 405
    # what vLLM refuses is its 400
    with pytest.raises(anthropic.BadRequestError):
        via.messages.create(model="tiny", max_tokens=5, messages=[{"role": "nobody", "content": "x"}])  # type: ignore[typeddict-item]


def test_a_p0_message_preempts_a_p3_message_which_runs_again(vllm: VllmProcess, gateway: LiveServer) -> None:
    via = client(gateway.url)
    long: dict[str, Any] = {
        "model": "tiny",
        "max_tokens": 1500,
        "messages": [{"role": "user", "content": "long"}],
        "extra_body": {"temperature": 0},
    }
    ref = client(vllm.url).messages.create(**long)
    before = preemptions(gateway)
    assert ref.usage.output_tokens == 1500  # (greedy on the tiny model: it does not stop sooner)
    run = overtaken(
        gateway.runtime,
        lambda: via.messages.create(**{**long, "extra_body": {"temperature": 0, "priority": "P3"}}),
        lambda: via.messages.create(
            model="tiny", max_tokens=5, messages=HELLO, extra_body={"priority": "P0"}
        ),  # type: ignore[arg-type]
        lambda tk: tk.phase is Phase.RUNNING and time.monotonic() - tk.first_start_s > 0.3,
    )
    got, p0 = run.low, run.urgent
    assert p0.usage.output_tokens == 5
    assert run.urgent_first, "the P3 message finished before the P0 was answered"
    assert preemptions(gateway) > before  # (a relayed answer carries no laneway object: the metric says)
    assert got.content == ref.content and got.usage.output_tokens == 1500  # run again from the start
