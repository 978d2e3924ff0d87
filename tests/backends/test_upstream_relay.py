"""A relayed run (an upstream's own Responses API): its events passed on as sent, its text
counted, its end held for the Done; what is not a Responses stream fails clearly."""

from __future__ import annotations

import json
from typing import Any

import pytest

from laneway.backends.upstream_relay import Passed, Relayed, usage_in, whole
from laneway.backends.upstream_run import Run, UpstreamUnavailable
from laneway.errors import BackendError
from laneway.generation import RELAY, RESPONSES, Delta, Job, ResumeRule, SamplingParams
from laneway.protocol.assemble import Assembly


def relayed(stream: bool = True, max_tokens: int | None = 8) -> tuple[Relayed, list[Any]]:
    job = Job(
        "resp_1",
        "m",
        SamplingParams(max_tokens=max_tokens),
        kind=RESPONSES,
        body={},
        stream=stream,
        resume=ResumeRule.NONE if stream else ResumeRule.RESTART,
    )
    seen: list[Any] = []
    run = Run(job, seen.append, "u", assembly=None if stream else Assembly())
    return Relayed(run, "u"), seen


def event(kind: str, **fields: Any) -> bytes:
    return json.dumps({"type": kind, **fields}).encode()


def final(status: str = "completed", **usage: int) -> dict[str, Any]:
    return {"id": "resp_up", "object": "response", "status": status, "usage": usage or None}


def test_events_pass_as_sent_and_the_end_is_held() -> None:
    r, seen = relayed()
    r.take(event("response.created", response=final("in_progress")))
    r.take(event("response.output_text.delta", delta="Hel"))
    r.take(event("response.output_text.delta", delta="lo"))
    r.take(event("response.completed", response=final(input_tokens=3, output_tokens=4)))
    r.take(event("response.output_text.delta", delta="late"))  # (after its end: not taken)
    assert [type(x) for x in seen] == [Delta] * 3
    assert [x.chunk["type"] for x in seen] == ["response.created", *["response.output_text.delta"] * 2]
    assert [x.text for x in seen] == ["", "Hel", "lo"] and [x.tokens for x in seen] == [0, 1, 2]
    done = r.ended()
    assert (done.text, done.finish_reason) == ("Hello", "stop")
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (3, 4)  # the upstream's count
    assert done.response is not None and done.response["id"] == "resp_up"
    assert [c["type"] for c in done.chunks] == ["response.completed"]


def test_a_whole_answer_sends_only_its_progress_and_an_unbelievable_count_is_not_taken() -> None:
    r, seen = relayed(stream=False)
    r.take(event("response.created", response=final("in_progress")))
    r.take(event("response.output_text.delta", delta="a"))
    r.take(event("response.completed", response=final("incomplete", input_tokens=2, output_tokens=99)))
    assert [x.text for x in seen] == ["a"] and seen[0].chunk is None
    done = r.ended()
    assert done.finish_reason == "length" and done.usage.completion_tokens == 1  # 99 > the 8 asked


@pytest.mark.parametrize(
    ("events", "error", "message"),
    [
        ([b"not json"], UpstreamUnavailable, "not JSON"),
        ([b"[1]"], UpstreamUnavailable, "no type"),
        ([event("error", message="boom")], BackendError, "boom"),
        ([event("response.created", response={})], UpstreamUnavailable, "ended before its answer"),
        ([event("response.completed", response="x")], UpstreamUnavailable, "no response object"),
        (
            [event("response.failed", response={"error": {"message": "engine died"}})],
            BackendError,
            "engine died",
        ),
        ([event("response.output_text.delta", delta="x")] * 9, UpstreamUnavailable, "more than the 8"),
    ],
)
def test_what_is_not_a_responses_stream_fails_clearly(
    events: list[bytes], error: type[Exception], message: str
) -> None:
    r, _ = relayed()
    with pytest.raises(error, match=message):
        for data in events:
            r.take(data)
        r.ended()


def test_any_other_stream_passes_event_by_event_with_its_usage_counted() -> None:
    job = Job(
        "relay-1", "m", SamplingParams(max_tokens=8), kind=RELAY, body={}, stream=True, endpoint="messages"
    )
    seen: list[Any] = []
    p = Passed(Run(job, seen.append, "u"), "u")
    p.take(event("message_start", message={"usage": {"input_tokens": 5, "output_tokens": 0}}))
    p.take(event("content_block_delta", delta={"type": "text_delta", "text": "Hi"}))
    p.take(event("message_delta", usage={"output_tokens": 3}))
    p.take(b"[DONE]")
    assert [x.chunk["type"] for x in seen] == ["message_start", "content_block_delta", "message_delta"]
    done = p.ended()
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (5, 3)
    assert done.raw == (b"data: [DONE]\n\n", "")
    with pytest.raises(UpstreamUnavailable, match="not JSON"):
        p2 = Passed(Run(job, seen.append, "u"), "u")
        p2.take(b"<html>")
    with pytest.raises(UpstreamUnavailable, match="its stream ended with no event"):
        Passed(Run(job, seen.append, "u"), "u").ended()  # (it was an empty 200)


def test_a_whole_answer_is_kept_as_sent() -> None:
    job = Job("relay-1", "m", SamplingParams(max_tokens=8), kind=RELAY, body={}, endpoint="score")
    run = Run(job, lambda _: None, "u")
    body = json.dumps({"data": [1], "usage": {"prompt_tokens": 7, "completion_tokens": 0}}).encode()
    done = whole(run, body, "application/json")
    assert done.raw == (body, "application/json") and done.usage.prompt_tokens == 7
    audio = whole(run, b"\x00RIFF", "audio/wav")  # (not JSON: nothing counted, kept as sent)
    assert audio.raw == (b"\x00RIFF", "audio/wav") and audio.usage.prompt_tokens == 0
    assert usage_in({"usage": {"prompt_tokens": True}}) == (None, None)  # (a count, or nothing)
