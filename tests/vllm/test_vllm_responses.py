"""The Responses API through laneway to a real vLLM's own ``/v1/responses``, with the official
openai client: the same answers as vLLM gives directly (whole, streamed, a conversation
continued by ``previous_response_id``, which laneway keeps, not vLLM), and a P0 response
preempting a P3 one, which runs again to the same text."""

from __future__ import annotations

import json
import time
from typing import Any

import openai

from laneway.testing import VllmProcess
from live_server import LiveServer, overtaken

TIMEOUT_S = 120


def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=TIMEOUT_S)


def test_responses_are_vllms_own_and_laneway_keeps_the_conversation(
    vllm: VllmProcess, gateway: LiveServer
) -> None:
    via, direct = client(gateway.base_url), client(vllm.url)
    ask: dict[str, Any] = {"model": "tiny", "max_output_tokens": 12, "temperature": 0}
    first = via.responses.create(input="Hello", instructions="be brief", **ask)
    ref = direct.responses.create(input="Hello", instructions="be brief", **ask)
    assert first.output_text == ref.output_text and first.output_text
    assert first.usage is not None and ref.usage is not None
    assert (first.usage.input_tokens, first.usage.output_tokens) == (
        ref.usage.input_tokens,
        ref.usage.output_tokens,
    )
    assert first.id.startswith("resp_") and first.id != ref.id and first.store is True
    assert first.model_extra["laneway"]["worker"] == "v0"  # type: ignore[index]
    # the next turn, continued by laneway: vLLM is sent the whole conversation, stores nothing
    second = via.responses.create(input="again", previous_response_id=first.id, **ask)
    history = [{"role": "user", "content": "Hello"}, *[o.model_dump() for o in ref.output]]
    ref2 = direct.responses.create(input=[*history, {"role": "user", "content": "again"}], **ask)  # type: ignore[list-item]
    assert second.output_text == ref2.output_text and second.previous_response_id == first.id
    kept = via.responses.retrieve(second.id)  # read back as it was answered
    assert kept.output_text == second.output_text and kept.store is True is second.store
    assert [i.role for i in via.responses.input_items.list(second.id)] == ["user"]  # type: ignore[union-attr]
    # streamed: vLLM's own events, laneway's id on the response they carry
    events = list(via.responses.create(input="Hello", instructions="be brief", stream=True, **ask))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert deltas == final.output_text == ref.output_text
    assert events[0].response.id == final.id and final.model_extra["laneway"]["priority"] == "P1"  # type: ignore[union-attr]
    kept = via.responses.retrieve(final.id)
    assert kept.output_text == ref.output_text and kept.store is True is final.store
    # what vLLM refuses comes back as its 400
    try:
        via.responses.create(input="x", reasoning={"effort": "bogus"}, **ask)  # type: ignore[typeddict-item]
    except openai.BadRequestError as exc:
        assert "effort" in str(exc)
    else:
        raise AssertionError("vLLM took a bogus reasoning effort")


def test_a_p0_response_preempts_a_p3_response_on_vllm(vllm: VllmProcess, gateway: LiveServer) -> None:
    via = client(gateway.base_url)
    long: dict[str, Any] = {
        "model": "tiny",
        "input": "Write a parser for key = value lines.",
        "max_output_tokens": 1500,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    ref = client(vllm.url).responses.create(**long)
    long["extra_body"] = {"ignore_eos": True, "priority": "P3"}
    run = overtaken(
        gateway.runtime,
        lambda: via.responses.create(**long),
        lambda: via.responses.create(
            model="tiny", input="urgent", max_output_tokens=5, temperature=0, extra_body={"priority": "P0"}
        ),
        lambda tk: tk.tokens >= 20,
    )
    got, p0 = run.low, run.urgent
    assert p0.model_extra["laneway"]["priority"] == "P0"  # type: ignore[index]
    assert run.urgent_first, "the P3 response finished before the P0 was answered"
    ext = got.model_extra["laneway"]
    assert ext["preemptions"] >= 1 and ext["resume"] == "restart", ext
    assert got.output_text == ref.output_text  # run again from the start: the same greedy text
    assert got.usage.output_tokens == ref.usage.output_tokens == 1500


def test_batch_lines_of_responses_are_vllms_answers(vllm: VllmProcess, gateway: LiveServer) -> None:
    via, direct = client(gateway.base_url), client(vllm.url)
    asks = [
        {"model": "tiny", "input": f"line {i}", "max_output_tokens": 6, "temperature": 0} for i in range(2)
    ]
    lines = [
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/responses", "body": a}
        for i, a in enumerate(asks)
    ]
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    f = via.files.create(file=("in.jsonl", data), purpose="batch")
    b = via.batches.create(input_file_id=f.id, endpoint="/v1/responses", completion_window="24h")
    deadline = time.monotonic() + 60
    while b.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, b
        time.sleep(0.1)
        b = via.batches.retrieve(b.id)
    assert b.status == "completed" and b.output_file_id is not None
    out = [json.loads(x) for x in via.files.content(b.output_file_id).text.splitlines()]
    bodies = [o["response"]["body"] for o in out]
    refs = [direct.responses.create(**a) for a in asks]  # type: ignore[call-overload]
    assert [x["output"][0]["content"][0]["text"] for x in bodies] == [r.output_text for r in refs]
    assert all(
        x["object"] == "response" and x["store"] is False and x["laneway"]["worker"] == "v0" for x in bodies
    )
