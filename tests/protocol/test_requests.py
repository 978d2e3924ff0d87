"""Request bodies → jobs (no server needed)."""

from __future__ import annotations

import pytest

from laneway.config import ServerConfig
from laneway.errors import InvalidRequest
from laneway.generation import CHAT, COMPLETION, EMBEDDING, Job, ResumeRule
from laneway.protocol.requests import Support, parse_request

BUILTIN = {"builtin:tiny": Support(False, frozenset({"n", "logprobs"}))}


def body(**extra: object) -> dict[str, object]:
    return {"model": "builtin:tiny", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_ignore_eos_is_taken_from_the_body() -> None:
    assert parse_request(body(), CHAT, ServerConfig(), BUILTIN).job.params.ignore_eos is False
    assert parse_request(body(ignore_eos=True), CHAT, ServerConfig(), BUILTIN).job.params.ignore_eos is True
    with pytest.raises(InvalidRequest) as info:
        parse_request(body(ignore_eos="yes"), CHAT, ServerConfig(), BUILTIN)
    assert info.value.param == "ignore_eos"


UPSTREAM = {"tiny": Support(True, kinds=frozenset({"chat", "completion", "embedding"}))}


def forwarded(kind: str = CHAT, **extra: object) -> Job:
    base: dict[str, object] = {"model": "tiny", **extra}
    if kind == CHAT:
        base.setdefault("messages", [{"role": "user", "content": "hi"}])
    elif kind == COMPLETION:
        base.setdefault("prompt", "hi")
    return parse_request(base, kind, ServerConfig(), UPSTREAM).job


def test_an_upstream_gets_every_field_but_laneways_own_and_nothing_invented() -> None:
    job = forwarded(
        priority="P0",
        preemptible=False,
        laneway={"priority": "P0"},
        service_tier="priority",
        tools=[{"type": "function", "function": {"name": "f"}}],
        logprobs=True,
        top_logprobs=5,
        vendor_extension={"x": 1},
        messages=[
            {"role": "tool", "content": None, "tool_call_id": "c1"},
            {"role": "user", "content": [{"type": "image_url"}]},
        ],
    )
    assert job.body is not None
    assert set(job.body) == {"model", "messages", "tools", "logprobs", "top_logprobs", "vendor_extension"}
    assert job.body["messages"][1]["content"] == [{"type": "image_url"}]  # content parts as sent
    plain = forwarded()
    assert plain.body == {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    assert plain.params.max_tokens is None  # the upstream's default, not laneway's


def test_a_chat_giving_both_limits_is_held_to_max_completion_tokens_and_sends_only_it() -> None:
    """Found failing: laneway held it to ``max_completion_tokens`` and an upstream that reads
    ``max_tokens`` first made more; laneway took that for a broken worker and put it out of
    placement. OpenAI and vLLM take ``max_completion_tokens``: the upstream gets only it."""
    job = forwarded(max_completion_tokens=2, max_tokens=3)
    assert job.params.max_tokens == 2
    assert job.body["max_completion_tokens"] == 2 and "max_tokens" not in job.body
    assert forwarded(max_tokens=3).params.max_tokens == 3
    assert (
        forwarded(COMPLETION, max_tokens=3, max_completion_tokens=2).params.max_tokens == 3
    )  # (chat's only)
    engine = parse_request(body(max_completion_tokens=2, max_tokens=3), CHAT, ServerConfig(), BUILTIN)
    assert engine.job.params.max_tokens == 2


def test_what_laneway_reads_of_a_forwarded_request_is_still_checked() -> None:
    for extra, param in (
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 10**19}, "max_tokens"),
        ({"max_completion_tokens": "9"}, "max_completion_tokens"),
        ({"max_completion_tokens": 2, "max_tokens": 3_000_000_000}, "max_tokens"),  # (both checked)
        ({"n": 0}, "n"),
        ({"stream": "yes"}, "stream"),
        ({"stream_options": []}, "stream_options"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # (not streamed)
        ({"stream": False, "stream_options": {}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
        ({"laneway": {"color": "red"}}, "laneway"),
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "hi", "name": 5}]}, "messages[0].name"),
    ):
        with pytest.raises(InvalidRequest) as info:
            forwarded(**extra)
        assert info.value.param == param, extra
    with pytest.raises(InvalidRequest) as info:
        forwarded(COMPLETION, prompt={"not": "a prompt"})
    assert info.value.param == "prompt"
    assert forwarded(COMPLETION, prompt=[[1, 2], [3]]).prompt == [[1, 2], [3]]
    with pytest.raises(InvalidRequest, match="cannot be streamed"):
        forwarded(EMBEDDING, input="x", stream=True)


@pytest.mark.parametrize(
    ("extra", "whole", "streamed"),
    [
        ({"temperature": 0}, ResumeRule.EXACT, ResumeRule.EXACT),
        ({"temperature": 0.8}, ResumeRule.EXACT, ResumeRule.EXACT),  # unseeded sampling resumes fine
        ({"temperature": 0, "seed": 1}, ResumeRule.EXACT, ResumeRule.EXACT),  # greedy: the seed draws nothing
        ({"seed": 1}, ResumeRule.RESTART, ResumeRule.NONE),  # the model's default temperature may sample
        ({"temperature": 0.7, "seed": 1}, ResumeRule.RESTART, ResumeRule.NONE),
        ({"n": 2, "temperature": 1}, ResumeRule.RESTART, ResumeRule.NONE),
        ({"tools": [{"type": "function"}]}, ResumeRule.RESTART, ResumeRule.NONE),
        ({"tools": [{"type": "function"}], "tool_choice": "none"}, ResumeRule.EXACT, ResumeRule.EXACT),
        ({"response_format": {"type": "json_schema"}}, ResumeRule.RESTART, ResumeRule.NONE),
        ({"response_format": {"type": "text"}}, ResumeRule.EXACT, ResumeRule.EXACT),
        ({"guided_regex": "a+"}, ResumeRule.RESTART, ResumeRule.NONE),
        ({"presence_penalty": 0.5}, ResumeRule.RESTART, ResumeRule.NONE),
        (
            {"repetition_penalty": 1.3},
            ResumeRule.EXACT,
            ResumeRule.EXACT,
        ),  # over prompt + output: carried over
    ],
)
def test_how_a_preemption_may_treat_a_forwarded_request(
    extra: dict[str, object], whole: str, streamed: str
) -> None:
    assert forwarded(**extra).resume == whole
    assert forwarded(stream=True, **extra).resume == streamed
    parsed = parse_request(
        {"model": "tiny", "prompt": "x", "stream": True, **extra}, COMPLETION, ServerConfig(), UPSTREAM
    )
    assert parsed.preemptible == (streamed != ResumeRule.NONE)


def test_several_prompts_or_an_echo_restart_and_embeddings_are_never_preempted() -> None:
    assert forwarded(COMPLETION, prompt=["a", "b"]).resume == ResumeRule.RESTART
    assert forwarded(COMPLETION, echo=True).resume == ResumeRule.RESTART
    assert forwarded(EMBEDDING, input="x").resume == ResumeRule.NONE


def test_the_built_in_engine_reads_only_what_it_implements() -> None:
    job = parse_request(body(n=2, logprobs=True, top_logprobs=3), CHAT, ServerConfig(), BUILTIN).job
    assert job.params.n == 2 and job.params.logprobs == 3 and job.body is None
    assert job.params.max_tokens == ServerConfig().default_max_tokens  # its own default
    # this engine (features: n, logprobs) lacks penalties
    for field, value in (("presence_penalty", 0.1), ("tools", [{"type": "function"}]), ("foo", 1)):
        with pytest.raises(InvalidRequest) as info:
            parse_request(body(**{field: value}), CHAT, ServerConfig(), BUILTIN)
        assert info.value.param == field and "not supported by the built-in engine" in info.value.message
    for neutral in ({"tools": []}, {"tool_choice": "none"}, {"presence_penalty": 0}, {"foo": None}):
        parse_request(body(**neutral), CHAT, ServerConfig(), BUILTIN)  # asks for nothing: served
    with pytest.raises(InvalidRequest, match="does not serve embedding"):
        parse_request({"model": "builtin:tiny", "input": "x"}, EMBEDDING, ServerConfig(), BUILTIN)


def test_a_chats_labels_are_read_and_checked_not_refused() -> None:
    """``user``, ``safety_identifier``, ``prompt_cache_key`` (OpenAI's chat fields): a
    client's labels, served by the built-in engine as ``user`` always was; bad ones named."""
    for field in ("user", "safety_identifier", "prompt_cache_key"):
        parse_request(body(**{field: "team-a"}), CHAT, ServerConfig(), BUILTIN)
        with pytest.raises(InvalidRequest) as info:
            parse_request(body(**{field: 5}), CHAT, ServerConfig(), BUILTIN)
        assert info.value.param == field
    with pytest.raises(InvalidRequest) as info:
        parse_request(body(prompt_cache_key="k" * 65), CHAT, ServerConfig(), BUILTIN)
    assert info.value.param == "prompt_cache_key" and "64" in info.value.message


def test_an_assistants_tool_call_is_named_as_what_the_engine_lacks() -> None:
    called = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
    ]
    with pytest.raises(InvalidRequest) as info:
        parse_request(body(messages=called), CHAT, ServerConfig(), BUILTIN)
    assert info.value.param == "messages[1].tool_calls"
