"""What the built-in engine implements, through the API and the official client; what it does
not is refused with a 400 naming the field, never dropped."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import openai
import pytest

from laneway.config import ServerConfig
from live_server import LiveServer, live_server, tiny

MODEL = "builtin:tiny"
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def builtin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data: Path = tmp_path_factory.mktemp("builtin")
    cfg = replace(ServerConfig(), workers=(tiny(2),), data_dir=data)
    with live_server(cfg) as server:
        yield server


@pytest.fixture
def client(builtin: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=builtin.base_url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def test_chat_logprobs_in_openai_shape(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=HI, max_tokens=10, temperature=0, logprobs=True, top_logprobs=2
    )
    msg = r.choices[0].message
    assert msg.refusal is None and msg.role == "assistant"
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert len(content) == r.usage.completion_tokens == 10  # type: ignore[union-attr]
    assert "".join(t.token for t in content) == msg.content
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token for t in content)


def test_completion_logprobs_and_offsets(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=MODEL,
        prompt="offsets",
        max_tokens=8,
        temperature=0,
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.text_offset is not None
    assert len(lp.tokens) == len(lp.token_logprobs or ()) == len(lp.top_logprobs or ()) == 8
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(8)]
    assert "".join(lp.tokens).replace("<eos>", "") == r.choices[0].text  # end-of-text: a token, no text


def test_several_choices_whole_and_streamed(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=12, temperature=1.0, seed=3, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) > 1  # seed + i per choice
    assert r.usage.completion_tokens == 36  # type: ignore[union-attr]
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=HI, max_tokens=12, temperature=1.0, seed=3, n=3, stream=True
        )
    )
    for i, c in enumerate(r.choices):
        parts = [ch.choices[0] for ch in chunks if ch.choices and ch.choices[0].index == i]
        assert parts[0].delta.role == "assistant"  # (each choice's: it was choice 0's alone)
        assert "".join(p.delta.content or "" for p in parts) == c.message.content  # the same seeds
        assert parts[-1].finish_reason == "length"
    assert "laneway" in (chunks[-1].model_extra or {})


def test_choices_that_need_more_kv_than_the_engine_holds_are_refused_by_n(client: openai.OpenAI) -> None:
    """``n`` choices are ``n`` sequences of the engine on one slot: at most what its slots hold
    at full context (2 slots of 2,048 tokens here)."""
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2000, n=16)
    err = info.value.body  # (the error object, as the client reads it)
    assert err["param"] == "n" and "more than this engine holds at once (2 slots of 2,048" in err["message"]
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=4, n=16)
    assert len(r.choices) == 16


def test_penalties_bias_stop_ids_and_vendor_sampling_fields_are_served(builtin: LiveServer) -> None:
    body = {
        "model": MODEL,
        "messages": HI,
        "max_tokens": 20,
        "temperature": 0.7,
        "seed": 1,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "repetition_penalty": 1.2,
        "top_k": 20,
        "min_p": 0.05,
        "logit_bias": {"104": 2.0},
        "stop_token_ids": [13],
        "min_tokens": 2,
        "user": "alice",
        "tools": [],  # empty: asks for nothing
        "response_format": {"type": "text"},
    }
    r = httpx.post(builtin.base_url + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 2


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
        ("response_format", {"type": "json_object"}),
        ("audio", {"voice": "alloy", "format": "mp3"}),
        ("guided_json", {"type": "object"}),
        ("no_such_field", 1),
    ],
)
def test_what_the_engine_cannot_do_is_refused_by_name(builtin: LiveServer, field: str, value: object) -> None:
    r = httpx.post(
        builtin.base_url + "/chat/completions",
        json={"model": MODEL, "messages": HI, "max_tokens": 2, field: value},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and "not supported by the built-in engine" in err["message"]


def test_a_vanishing_temperature_hurts_nobody(builtin: LiveServer) -> None:
    """Between two normal requests, on the same worker: all three answered."""
    for temperature in (0.0, 1e-40, 1e-300, 0.0):
        r = httpx.post(
            builtin.base_url + "/chat/completions",
            json={"model": MODEL, "messages": HI, "max_tokens": 5, "temperature": temperature},
            timeout=30,
        )
        assert r.status_code == 200, r.text
    assert httpx.get(builtin.url + "/readyz", timeout=10).status_code == 200


def test_token_ids_asked_and_prompts_given_as_ids(builtin: LiveServer) -> None:
    """vLLM's return_token_ids, and a prompt of token ids: what a laneway in front of this one
    resumes a preempted request with."""
    url = builtin.base_url
    body = {"model": MODEL, "prompt": "ids", "max_tokens": 12, "temperature": 0, "return_token_ids": True}
    whole = httpx.post(url + "/completions", json=body, timeout=30).json()
    choice = whole["choices"][0]
    prompt, ids = choice["prompt_token_ids"], choice["token_ids"]
    assert len(ids) == whole["usage"]["completion_tokens"] and len(prompt) == whole["usage"]["prompt_tokens"]
    rest = httpx.post(
        url + "/completions", json={**body, "prompt": prompt + ids[:5], "max_tokens": 7}, timeout=30
    ).json()
    assert rest["choices"][0]["token_ids"] == ids[5:]  # the same continuation, from the ids
    chat = {
        "model": MODEL,
        "messages": HI,
        "max_tokens": 6,
        "temperature": 0,
        "return_token_ids": True,
        "stream": True,
    }
    chunks = []
    with httpx.stream("POST", url + "/chat/completions", json=chat, timeout=30) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert chunks[0]["prompt_token_ids"] and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    streamed = [t for c in chunks[1:] for ch in c["choices"] for t in ch.get("token_ids", [])]
    whole_chat = httpx.post(url + "/chat/completions", json={**chat, "stream": False}, timeout=30).json()
    assert streamed == whole_chat["choices"][0]["token_ids"]
    assert whole_chat["prompt_token_ids"] == chunks[0]["prompt_token_ids"]


def test_an_answer_ended_by_its_end_of_text_id_counts_that_id_as_vllm_does(builtin: LiveServer) -> None:
    """The end-of-text id that ends an answer is given in ``token_ids`` and counted in
    ``usage.completion_tokens`` (vLLM's way: a laneway in front of this one checks the two agree)."""
    stopped = 0
    for i in range(40):  # (random weights: some prompts end by their end-of-text id soon)
        body = {
            "model": MODEL,
            "prompt": f"eos {i}",
            "max_tokens": 48,
            "temperature": 0,
            "return_token_ids": True,
        }
        got = httpx.post(builtin.base_url + "/completions", json=body, timeout=30).json()
        choice = got["choices"][0]
        assert len(choice["token_ids"]) == got["usage"]["completion_tokens"], got
        stopped += choice["finish_reason"] == "stop"
        if stopped >= 2:
            break
    assert stopped >= 2, "no answer ended by its end-of-text id in 40 prompts"


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"logit_bias": {"99999999": 5}}, "logit_bias", "token id 99999999 is not in model"),
        ({"stop_token_ids": [1 << 40]}, "stop_token_ids", "is not in model"),
        ({"n": 2, "best_of": 1}, "best_of", "must be at least n"),
    ],
)
def test_token_ids_past_the_vocabulary_and_best_of_below_n_are_refused(
    builtin: LiveServer, extra: dict[str, object], param: str, says: str
) -> None:
    r = httpx.post(
        builtin.base_url + "/completions",
        json={"model": MODEL, "prompt": "hi", "max_tokens": 2, **extra},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"], err


def test_a_tenants_token_budget_follows_what_the_engine_counted(tmp_path: Path) -> None:
    """A prompt the engine refuses (too long for its context) costs the tenant nothing,
    and a chat prompt of text parts is charged its text (the tokenizer's count at the end)."""
    from laneway.config import hash_key, parse_config

    cfg = parse_config(
        {
            "server": {"data_dir": str(tmp_path)},
            "workers": [{"name": "w0", "model": MODEL, "slots": 2}],
            "tenants": {
                "t": {
                    "key_sha256": [hash_key("k")],
                    "quotas": {"P2": {"tokens_per_min": 6, "tokens_burst": 3000}},
                }
            },
        }
    )
    auth = {"Authorization": "Bearer k"}

    def post(body: dict[str, object]) -> httpx.Response:
        return httpx.post(
            s.base_url + "/chat/completions",
            json={"model": MODEL, "priority": "P2", **body},
            headers=auth,
            timeout=60,
        )

    with live_server(cfg) as s:
        too_long = post({"messages": [{"role": "user", "content": "x" * 100_000}], "max_tokens": 1})
        assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"
        assert post({"messages": HI, "max_tokens": 1}).status_code == 200  # not locked out by it
        parts = [{"role": "user", "content": [{"type": "text", "text": "x" * 1000}]}]
        got = [post({"messages": parts, "max_tokens": 1}).status_code for _ in range(6)]
        assert got[0] == 200 and 429 in got, got  # ~1,000 tokens each against a burst of 3,000


def test_a_request_that_can_never_fit_is_refused_as_it_arrives_and_a_default_size_fits(
    builtin: LiveServer,
) -> None:
    # both slots busy: it was queued, and refused only once a slot came (a queue timeout's
    # 503, which clients retry, where the class's timeout came first)
    long = {"model": MODEL, "prompt": "busy", "max_tokens": 1500, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=builtin.base_url, timeout=60) as c:
        with (
            c.stream("POST", "/completions", json=long) as a,
            c.stream("POST", "/completions", json=long) as b,
        ):
            next(a.iter_lines()), next(b.iter_lines())  # (both started)
            r = c.post("/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 3000})
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
            assert r.json()["error"]["param"] == "max_tokens"
            chat = {"model": MODEL, "messages": HI, "max_completion_tokens": 3000}
            r = c.post("/chat/completions", json=chat)  # (the error names the field it was given in)
            err = r.json()["error"]
            assert r.status_code == 400 and err["param"] == "max_completion_tokens", r.text
            assert "lower max_completion_tokens to at most" in err["message"], err
            assert builtin.runtime.sched.queued == 0
            assert builtin.runtime.workers["w0"].capacity().busy == 2  # (they run on: it came first)
        # no max_tokens given: the default (256) is lowered to what the context leaves, not refused
        prompt = [65] * 2000  # (token ids: 2,000 prompt tokens of 2,048)
        r = c.post("/completions", json={"model": MODEL, "prompt": prompt, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert (
            r.json()["usage"]["completion_tokens"] == 48
            and r.json()["choices"][0]["finish_reason"] == "length"
        )
