"""Folding an upstream's stream into the whole answer it would have sent."""

from __future__ import annotations

from typing import Any

from laneway.protocol.assemble import Assembly, merge


def chunk(**choice: Any) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, **choice}],
    }


def test_text_tool_calls_logprobs_and_choices_are_put_together() -> None:
    a = Assembly()
    a.add(chunk(delta={"role": "assistant", "content": ""}, logprobs=None, finish_reason=None))
    a.add(chunk(delta={"content": "Hel"}, logprobs={"content": [{"token": "Hel", "logprob": -0.1}]}))
    a.add(chunk(delta={"content": "lo"}, logprobs={"content": [{"token": "lo", "logprob": -0.2}]}))
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "look", "arguments": ""}}
    a.add(chunk(delta={"tool_calls": [call]}))
    a.add(chunk(delta={"tool_calls": [{"index": 0, "function": {"arguments": '{"w": '}}]}))
    a.add(
        chunk(
            delta={
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "b", "arguments": "{}"},
                    }
                ]
            }
        )
    )
    a.add(
        chunk(
            delta={"tool_calls": [{"index": 0, "function": {"arguments": '"x"}'}}]},
            finish_reason="tool_calls",
        )
    )
    a.add(
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": {"x": 1},
            "system_fingerprint": "fp",
        }
    )
    out = a.answer({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7})
    assert out["object"] == "chat.completion" and out["system_fingerprint"] == "fp"
    [choice] = out["choices"]
    message = choice["message"]
    assert message["role"] == "assistant" and message["content"] == "Hello" and message["refusal"] is None
    assert [c["function"] for c in message["tool_calls"]] == [
        {"name": "look", "arguments": '{"w": "x"}'},
        {"name": "b", "arguments": "{}"},
    ]
    assert [c["id"] for c in message["tool_calls"]] == ["call_1", "call_2"]  # replaced, not concatenated
    assert [t["token"] for t in choice["logprobs"]["content"]] == ["Hel", "lo"]
    assert choice["finish_reason"] == "tool_calls"
    assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert list(choice) == ["index", "message", "logprobs", "finish_reason"]


def test_several_choices_and_completion_objects() -> None:
    a = Assembly()
    for i, text in ((0, "a"), (1, "x"), (0, "b"), (1, "y")):
        a.add(
            {
                "object": "text_completion",
                "choices": [{"index": i, "text": text, "token_ids": [i], "finish_reason": None}],
            }
        )
    a.add({"object": "text_completion", "choices": [{"index": 1, "text": "", "finish_reason": "length"}]})
    out = a.answer(None)
    assert out["object"] == "text_completion"
    assert [(c["index"], c["text"], c["token_ids"], c["finish_reason"]) for c in out["choices"]] == [
        (0, "ab", [0, 0], None),
        (1, "xy", [1, 1], "length"),
    ]


def test_merge_keeps_a_value_a_later_null_does_not_carry() -> None:
    acc: dict[str, Any] = {}
    merge(acc, {"finish_reason": None, "stop_reason": None})
    merge(acc, {"finish_reason": "stop", "stop_reason": "\n"})
    merge(acc, {"finish_reason": None})
    assert acc == {"finish_reason": "stop", "stop_reason": "\n"}
