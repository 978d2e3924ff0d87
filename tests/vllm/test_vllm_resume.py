"""Preempted requests on a real vLLM resume from their token ids: the same answer as uninterrupted.

The model's tokenizer is a byte-level BPE, on which a resume by text does not
give the same tokens; vLLM streams several tokens per chunk here.
"""

from __future__ import annotations

from typing import Any

import pytest

from laneway.testing import VllmProcess
from live_server import LiveServer
from vllm_helpers import post, preempted, streamed_text, text_of

CHAT = [{"role": "user", "content": "Write a parser for key = value lines."}]
PROMPT = "def parse(line):\n    key, value ="


def body(kind: str, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": "tiny",
        "max_tokens": 1500,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }
    if kind == "chat":
        base["messages"] = CHAT
    else:
        base["prompt"] = PROMPT
    return base


@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
def test_greedy_preemption_resumes_exactly(
    vllm: VllmProcess, gateway: LiveServer, kind: str, streaming: bool
) -> None:
    b = body(kind)
    ref = post(vllm.url, kind, b)
    got, p0 = preempted(gateway, kind, b, streaming=streaming)
    assert p0["laneway"]["priority"] == "P0"
    if streaming:
        ext = next(c["laneway"] for c in got if "laneway" in c)
        assert streamed_text(got) == text_of(ref)
    else:
        ext = got["laneway"]
        assert text_of(got) == text_of(ref)
        assert got["usage"] == {
            k: ref["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")
        } | {
            k: v
            for k, v in got["usage"].items()
            if k not in ("prompt_tokens", "completion_tokens", "total_tokens")
        }
        assert got["choices"][0]["finish_reason"] == ref["choices"][0]["finish_reason"] == "length"
    assert ext["preemptions"] >= 1 and ext["resume"] == "token_ids", (ext, p0["laneway"])


def test_resume_keeps_text_held_back_for_stop_strings_and_logprobs(
    vllm: VllmProcess, gateway: LiveServer
) -> None:
    """vLLM holds text back while it could be the start of a stop string; ids come first.
    The resumed answer still has all of it, and a log-probability for every token."""
    b = body("chat", stop=["@@@@@@@@@@"], logprobs=True, top_logprobs=2, ignore_eos=False)
    b["messages"] = [
        {"role": "user", "content": "Explain sorting"}
    ]  # greedy: no end of text for 1,500 tokens
    ref = post(vllm.url, "chat", b)
    assert ref["usage"]["completion_tokens"] > 200  # long enough to be preempted
    got, _ = preempted(gateway, "chat", b, streaming=False)
    assert got["laneway"]["preemptions"] >= 1 and got["laneway"]["resume"] == "token_ids"
    assert text_of(got) == text_of(ref)
    entries = got["choices"][0]["logprobs"]["content"]
    assert len(entries) == got["usage"]["completion_tokens"] == ref["usage"]["completion_tokens"]
    assert [e["token"] for e in entries] == [e["token"] for e in ref["choices"][0]["logprobs"]["content"]]
    assert all(len(e["top_logprobs"]) == 2 for e in entries)


def test_stop_strings_with_special_tokens_in_the_output_restart(
    vllm: VllmProcess, gateway: LiveServer
) -> None:
    """Under ignore_eos the output holds end-of-text tokens, which vLLM's /detokenize writes out
    and its stream does not: the text it held back cannot be read, and a client that saw nothing
    yet gets the request run again from scratch (the same answer)."""
    b = body("completion", stop=["@@@@@@@@@@"])
    ref = post(vllm.url, "completion", b)
    got, _ = preempted(gateway, "completion", b, streaming=False)
    assert got["laneway"]["preemptions"] >= 1
    assert text_of(got) == text_of(ref)
    assert got["usage"]["completion_tokens"] == ref["usage"]["completion_tokens"] == 1500


def test_resume_keeps_end_of_text_tokens_under_ignore_eos(vllm: VllmProcess, gateway: LiveServer) -> None:
    """With ignore_eos the model may write its end-of-text token (no text) and go on: it is a token
    of the answer, kept by a resume from ids (a resume by text would lose it)."""
    b = body("completion", return_token_ids=True)
    ref = post(vllm.url, "completion", b)
    got, _ = preempted(gateway, "completion", b, streaming=False)
    assert got["laneway"]["preemptions"] >= 1
    assert got["choices"][0]["token_ids"] == ref["choices"][0]["token_ids"]
    assert got["prompt_token_ids"] if "prompt_token_ids" in got else got["choices"][0]["prompt_token_ids"]
    assert text_of(got) == text_of(ref)


def test_seeded_sampling_restarts_from_scratch_with_the_same_answer(
    vllm: VllmProcess, gateway: LiveServer
) -> None:
    """A seeded sampled request cannot resume (the engine restarts its random stream): not yet
    shown to anyone, it runs again from the start and gives what one run gives."""
    b = body("completion", temperature=1.0, seed=1234)
    ref = post(vllm.url, "completion", b)
    got, _ = preempted(gateway, "completion", b, streaming=False)
    assert got["laneway"]["preemptions"] >= 1 and got["laneway"]["resume"] == "restart"
    assert text_of(got) == text_of(ref)
    assert got["usage"]["completion_tokens"] == ref["usage"]["completion_tokens"]


def test_a_streamed_request_that_cannot_resume_is_not_preempted(gateway: LiveServer) -> None:
    """Streamed text cannot be taken back: several choices, once started, run to their end."""
    b = body("completion", n=2, max_tokens=300, temperature=0.8)
    chunks, p0 = preempted(gateway, "completion", b, streaming=True)
    ext = next(c["laneway"] for c in chunks if "laneway" in c)
    assert ext["preemptions"] == 0 and ext["resume"] == "none"
    assert {c["index"] for chunk in chunks for c in chunk["choices"]} == {0, 1}
    assert p0["laneway"]["queue_ms"] > 0  # it waited for the slot
