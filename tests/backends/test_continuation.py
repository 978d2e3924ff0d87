"""The request that continues a preempted one, and its chunks as a chat request's."""

from __future__ import annotations

from laneway.backends.continuation import as_chat_chunk, by_ids, by_text, chat_logprobs


def test_by_ids_continues_chat_as_a_completion_of_the_ids_so_far() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [],
        "max_completion_tokens": 100,
        "min_tokens": 30,
        "logprobs": True,
        "top_logprobs": 2,
        "temperature": 0,
        "stop": ["\n"],
        "ignore_eos": True,
        "user": "alice",
    }
    out = by_ids(body, "chat", [1, 2, 3, 9, 9], 10)
    assert out == {
        "model": "m",
        "temperature": 0,
        "stop": ["\n"],
        "ignore_eos": True,
        "user": "alice",
        "max_tokens": 90,
        "min_tokens": 20,
        "prompt": [1, 2, 3, 9, 9],
        "logprobs": 2,
    }
    assert "max_tokens" not in by_ids({"prompt": "x"}, "completion", [1], 5)  # none given: none invented
    assert by_ids({"prompt": "x", "logprobs": 3, "echo": True}, "completion", [1], 5)["logprobs"] == 3


def test_by_text_appends_or_continues_the_last_message() -> None:
    chat = by_text({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}, "chat", "Hel", 3)
    assert chat["messages"][-1] == {"role": "assistant", "content": "Hel"}
    assert chat["continue_final_message"] is True and chat["add_generation_prompt"] is False
    assert chat["max_tokens"] == 7
    text = by_text({"prompt": "say ", "echo": True}, "completion", "hello", 1)
    assert text == {"prompt": "say hello"}


def test_completion_chunks_read_as_chat_chunks() -> None:
    chunk = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "text": "ab",
                "logprobs": {
                    "tokens": ["a", "b"],
                    "token_logprobs": [-1.0, -2.0],
                    "top_logprobs": [{"a": -1.0}, None],
                },
                "finish_reason": None,
                "stop_reason": None,
                "token_ids": [5, 6],
            }
        ],
    }
    out = as_chat_chunk(chunk)
    assert out["object"] == "chat.completion.chunk"
    [c] = out["choices"]
    assert c["delta"] == {"content": "ab"} and c["token_ids"] == [5, 6] and c["finish_reason"] is None
    assert c["logprobs"]["content"] == [
        {
            "token": "a",
            "logprob": -1.0,
            "bytes": [97],
            "top_logprobs": [{"token": "a", "logprob": -1.0, "bytes": [97]}],
        },
        {"token": "b", "logprob": -2.0, "bytes": [98], "top_logprobs": []},
    ]
    assert chat_logprobs(None) is None
