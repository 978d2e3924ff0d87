"""Every field laneway does not own reaches vLLM as sent, and vLLM's answer reaches the client.

Each request goes to vLLM directly and through laneway; greedy or seeded, the
two answers must be the same (but for the id, the creation time and laneway's
own object), streamed or not.
"""

from __future__ import annotations

from typing import Any

import pytest

from batch_util import chat_line, client, lines_of, submit, wait
from laneway.testing import VllmProcess
from live_server import LiveServer
from vllm_helpers import CLIENT, post, stream

MESSAGES = [{"role": "user", "content": "Hi"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    },
}
CASES: list[tuple[str, dict[str, Any]]] = [
    ("chat", {"logprobs": True, "top_logprobs": 3}),
    ("completion", {"logprobs": 2}),
    ("chat", {"n": 3, "temperature": 1.0, "seed": 7}),
    ("completion", {"n": 2, "temperature": 0.7, "seed": 3, "best_of": 2}),
    ("chat", {"temperature": 1.0, "seed": 42, "top_p": 0.9, "top_k": 20, "min_p": 0.05}),
    ("chat", {"presence_penalty": 1.5, "frequency_penalty": 1.0}),
    ("chat", {"repetition_penalty": 1.4}),
    ("chat", {"logit_bias": {"1005": 100}}),
    ("chat", {"min_tokens": 20, "stop_token_ids": [1005]}),
    ("chat", {"stop": ["md"]}),
    ("chat", {"response_format": {"type": "json_object"}}),
    ("chat", {"tools": [TOOL], "tool_choice": "required"}),
    ("chat", {"user": "alice", "skip_special_tokens": False, "metadata": {"team": "search"}}),
    ("completion", {"echo": True}),
    ("chat", {"return_token_ids": True}),
    ("completion", {"prompt": [[43, 76], [200, 300, 12]]}),  # token ids, two prompts
]


def request(kind: str, extra: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 24, "temperature": 0, **extra}
    if kind == "chat":
        body.setdefault("messages", MESSAGES)
    else:
        body.setdefault("prompt", "Hi")
    return body


def choices(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The choices, but for what vLLM draws at random (tool call ids) and for the null fields
    a whole vLLM answer has and one assembled from its stream does not."""
    out = []
    for c in answer["choices"]:
        c = {k: v for k, v in c.items() if v is not None}
        message = dict(c.get("message") or {})
        for call in message.get("tool_calls") or ():
            call.pop("id", None)
        if message:
            c["message"] = {k: v for k, v in message.items() if v not in (None, [])}
        out.append(c)
    return sorted(out, key=lambda c: c["index"])


@pytest.mark.parametrize(("kind", "extra"), CASES, ids=[f"{k}-{'-'.join(e)}" for k, e in CASES])
def test_fields_reach_vllm_and_its_answer_comes_back(
    vllm: VllmProcess, gateway: LiveServer, kind: str, extra: dict[str, Any]
) -> None:
    body = request(kind, extra)
    direct = post(vllm.url, kind, body)
    via = post(gateway.base_url, kind, body)
    assert choices(via) == choices(direct)
    assert via["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]
    assert via["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"]
    assert via["model"] == "tiny" and via["laneway"]["worker"] == "v0"
    assert via["object"] == direct["object"]
    if extra.get("tools") or extra.get("response_format") or extra.get("logit_bias"):
        # it changed what vLLM wrote: it did reach vLLM (the random model writes no whole call)
        plain = post(vllm.url, kind, request(kind, {}))
        assert choices(via) != choices(plain)
    if extra.get("return_token_ids"):
        assert via["prompt_token_ids"] == direct["prompt_token_ids"]
        assert via["choices"][0]["token_ids"] == direct["choices"][0]["token_ids"]
    else:  # the ids laneway asks for itself are not shown
        assert via.get("prompt_token_ids") is None and all(c.get("token_ids") is None for c in via["choices"])


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_streamed_chunks_are_vllms_own(vllm: VllmProcess, gateway: LiveServer, kind: str) -> None:
    """vLLM here streams several tokens per chunk (--stream-interval 5): laneway forwards its
    chunks as they are, usage last when asked, laneway's object on the chunk that ends the
    choice and on the last one (the usage chunk)."""
    body = request(kind, {"max_tokens": 40, "logprobs": True if kind == "chat" else 1})
    body["stream_options"] = {"include_usage": True}
    direct = stream(vllm.url, kind, body)
    via = stream(gateway.base_url, kind, body)

    def plain(chunks: list[dict[str, Any]]) -> list[Any]:
        return [([{k: v for k, v in c.items()} for c in ch["choices"]], ch.get("usage")) for ch in chunks]

    assert plain(via) == plain(direct)
    assert len(via) < 40  # several tokens to a chunk: each went through as one
    assert {ch["id"] for ch in via} == {via[0]["id"]} and via[0]["id"].startswith(
        "chatcmpl-" if kind == "chat" else "cmpl-"
    )
    ends, last = [ch for ch in via if "laneway" in ch]
    assert ends["choices"] and ends["choices"][0]["finish_reason"] == "length"
    assert last is via[-1] and last["laneway"] == ends["laneway"]
    assert via[-1]["usage"]["completion_tokens"] == 40 and not via[-1]["choices"]


def test_defaults_are_the_engines_not_laneways(vllm: VllmProcess, gateway: LiveServer) -> None:
    """No max_tokens, temperature or top_p sent: vLLM applies its own (here: greedy from the
    model's generation config is not set, so sampling; max_tokens the rest of the context)."""
    body = {"model": "tiny", "messages": MESSAGES, "seed": 5}
    direct = post(vllm.url, "chat", body)
    via = post(gateway.base_url, "chat", body)
    assert via["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"]
    assert choices(via) == choices(direct)


def test_content_parts_and_embeddings_are_forwarded(gateway: LiveServer) -> None:
    """laneway does not refuse what the upstream may serve: an image part and an embeddings request
    reach vLLM, whose own refusal (this model is text-only, and generates) comes back."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    parts = [{"type": "text", "text": "What is this?"}, image]
    r = CLIENT.post(
        gateway.base_url + "/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": parts}], "max_tokens": 5},
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("upstream v0:")
    r = CLIENT.post(gateway.base_url + "/embeddings", json={"model": "tiny", "input": "hello"})
    assert r.status_code in (400, 404), r.text
    error = r.json()["error"]
    if r.status_code == 404:  # (a vLLM that serves no embeddings has no such route)
        assert error["code"] == "not_found", error
        assert error["message"].startswith("upstream v0 does not serve POST /embeddings"), error
    else:
        assert error["message"].startswith("upstream v0:"), error


def test_batch_lines_are_forwarded_and_answered_as_vllm_answers(
    vllm: VllmProcess, gateway: LiveServer
) -> None:
    """A Batch API file against the upstream: each line's body goes to vLLM as sent, each output
    line holds vLLM's answer (as the same request sent directly)."""
    cases = [
        ("a", {"max_tokens": 10}),
        ("b", {"max_tokens": 8, "logprobs": True, "top_logprobs": 2}),
        ("c", {"max_tokens": 6, "n": 2, "temperature": 1.0, "seed": 4}),
    ]
    lines = [chat_line(cid, model="tiny", **{"temperature": 0, **extra}) for cid, extra in cases]
    c = client(gateway.base_url)
    batch = submit(c, lines)
    done = wait(c, batch.id, timeout_s=120)
    assert done.status == "completed" and done.request_counts.completed == 3, done
    out = {x["custom_id"]: x["response"]["body"] for x in lines_of(c, done.output_file_id)}
    for line in lines:
        direct = post(vllm.url, "chat", line["body"])
        got = out[line["custom_id"]]
        assert choices(got) == choices(direct)
        assert got["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"]
        assert got["laneway"]["priority"] == "P2"
