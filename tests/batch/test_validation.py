"""Bad input fails the batch with every bad line named (OpenAI behaviour), never a 500."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import httpx
import openai
import pytest

from batch_util import chat_line, client, jsonl, lines_of, submit, wait
from laneway.batch.validate import validate_input
from laneway.batch.window import window_seconds
from laneway.config import ServerConfig
from live_server import LiveServer


def test_bad_lines_fail_the_batch_naming_each(batch_server: LiveServer) -> None:
    c = client(batch_server.base_url)
    lines = [
        chat_line("ok-1"),
        "{not json",
        chat_line("ok-1"),  # duplicate custom_id
        {**chat_line("url"), "url": "/v1/moderations"},
        chat_line("model", model="gpt-nope"),
        chat_line("param", max_tokens=0),
        {"custom_id": 7, "method": "POST", "url": "/v1/chat/completions", "body": {}},
        "[1, 2]",
        chat_line("stream", stream=True),
        "",  # blank lines are skipped
        chat_line("ok-2"),
    ]
    b = wait(c, submit(c, lines).id)
    assert b.status == "failed" and b.failed_at is not None and b.output_file_id is None
    errors = [(e.line, e.code) for e in b.errors.data]
    assert errors == [
        (2, "invalid_json_line"),
        (3, "duplicate_custom_id"),
        (4, "invalid_url"),
        (5, "model_not_found"),
        (6, "invalid_request"),
        (7, "invalid_custom_id"),
        (8, "invalid_json_line"),
        (9, "invalid_request"),
    ]
    assert all(e.message.startswith(f"line {e.line}: ") for e in b.errors.data)
    err = lines_of(c, b.error_file_id)
    assert [(e["error"]["line"], e["custom_id"]) for e in err][:4] == [
        (2, None),
        (3, "ok-1"),
        (4, "url"),
        (5, "model"),
    ]
    assert b.request_counts.total == 0


def test_a_line_longer_than_a_request_body_may_be_fails_naming_the_limit() -> None:
    config = replace(ServerConfig(), max_body_bytes=4096)
    big = chat_line("big", max_tokens=3)
    big["body"]["messages"][0]["content"] = "x" * 4096
    out = validate_input(jsonl([big]), "/v1/chat/completions", config, {})
    [error] = out.errors
    assert (error["line"], error["code"]) == (1, "line_too_large")
    assert "the limit is 4096 ([server] max_body_bytes" in error["message"], error


def test_too_many_lines_and_empty_files_fail(batch_server: LiveServer) -> None:
    c = client(batch_server.base_url)
    # the fixture allows 500: one more is refused as it is uploaded (blank lines are no lines)
    with pytest.raises(openai.BadRequestError) as info:
        c.files.create(file=("input.jsonl", jsonl([chat_line(f"n{i}") for i in range(501)])), purpose="batch")
    error = info.value.body
    assert isinstance(error, dict) and error["code"] == "too_many_requests" and error["param"] == "file"
    full = wait(c, submit(c, ["", *(chat_line(f"n{i}") for i in range(500)), "  ", ""]).id)
    assert full.status != "failed", full.errors
    empty = wait(c, submit(c, ["", "  "]).id)
    assert empty.status == "failed" and [e.code for e in empty.errors.data] == ["empty_file"]


def test_a_file_not_in_utf8_fails_in_one_error_saying_so(batch_server: LiveServer) -> None:
    """JSON Lines are UTF-8: a file in UTF-16 (which json.loads would take) fails as a whole,
    where it was taken and run, or failed each line as something else."""
    c = client(batch_server.base_url)

    def run(content: bytes) -> Any:
        f = c.files.create(file=("input.jsonl", content), purpose="batch")
        made = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        return wait(c, made.id)

    text = jsonl([chat_line("u1"), chat_line("u2")]).decode()
    for encoding in ("utf-16", "utf-32-le"):
        b = run(text.encode(encoding))
        assert b.status == "failed", (encoding, b)
        assert [(e.code, e.line) for e in b.errors.data] == [("invalid_file_encoding", 1)], b.errors
        assert "not UTF-8" in b.errors.data[0].message
    second = json.dumps(chat_line("café"), ensure_ascii=False)
    b = run(jsonl([chat_line("ok")]) + second.encode("latin-1") + b"\n")  # (its é one byte, not UTF-8)
    assert [(e.code, e.line) for e in b.errors.data] == [("invalid_file_encoding", 2)]
    b = run(b"\xef\xbb\xbf" + jsonl([chat_line("bom")]))  # (UTF-8 with a byte order mark: taken)
    assert b.status == "completed" and b.request_counts.completed == 1, b


def test_request_errors_at_creation(batch_server: LiveServer) -> None:
    c = client(batch_server.base_url)
    f = c.files.create(file=("a.jsonl", jsonl([chat_line("a")])), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="endpoint must be one of"):
        c.batches.create(input_file_id=f.id, endpoint="/v1/moderations", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="soon")  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        c.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="input_file_id must be a file id \\(a string\\), got 5"):
        c.batches.create(input_file_id=5, endpoint="/v1/chat/completions", completion_window="24h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="unknown priority"):
        c.batches.create(
            input_file_id=f.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"priority": "P9"},
        )
    with pytest.raises(openai.NotFoundError):
        c.batches.retrieve("batch_nope")
    with pytest.raises(openai.BadRequestError, match="purpose"):
        c.files.create(file=("a.jsonl", b"{}\n"), purpose="fine-tune")
    with pytest.raises(openai.APIStatusError) as too_big:
        c.files.create(file=("big.jsonl", b"x" * (400 << 10)), purpose="batch")
    assert too_big.value.status_code == 413
    r = httpx.post(
        batch_server.base_url + "/files", content=b"{}", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(batch_server.base_url + "/batches", params={"limit": "0"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit"
    r = httpx.post(batch_server.base_url + "/batches", content=b"nope")
    assert r.status_code == 400


def test_missing_fields_are_named(batch_server: LiveServer) -> None:
    c = client(batch_server.base_url)
    f = c.files.create(file=("a.jsonl", jsonl([chat_line("a")])), purpose="batch")
    url = batch_server.base_url

    def error(r: httpx.Response) -> tuple[str | None, str]:
        assert r.status_code == 400, r.text
        e = r.json()["error"]
        assert e["type"] == "invalid_request_error"
        return e["param"], e["message"]

    body = {"input_file_id": f.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    # completion_window is required, as at OpenAI (no silent 24h)
    without = {k: v for k, v in body.items() if k != "completion_window"}
    assert error(httpx.post(url + "/batches", json=without)) == (
        "completion_window",
        "completion_window is required (e.g. '24h'; also s, m or d)",
    )
    without = {k: v for k, v in body.items() if k != "endpoint"}
    assert error(httpx.post(url + "/batches", json=without)) == (
        "endpoint",
        "endpoint is required (one of: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses)",
    )
    without = {k: v for k, v in body.items() if k != "input_file_id"}
    assert error(httpx.post(url + "/batches", json=without)) == ("input_file_id", "input_file_id is required")
    data = jsonl([chat_line("a")])
    assert error(httpx.post(url + "/files", files={"file": ("a.jsonl", data)})) == (
        "purpose",
        "purpose is required (one of: batch)",
    )
    assert error(httpx.post(url + "/files", files={"file": ("a.jsonl", data)}, data={"purpose": "x"})) == (
        "purpose",
        "purpose must be one of: batch; got 'x'",
    )
    assert error(httpx.post(url + "/files", files={"purpose": (None, "batch")})) == (
        "file",
        "file is required (the JSONL file, as a multipart file part)",
    )
    assert error(httpx.post(url + "/files", files={"purpose": (None, "batch"), "file": (None, "{}")})) == (
        "file",
        "file must be a file part (with a filename), not a text field",
    )
    assert httpx.post(url + "/batches", json=body).status_code == 200


def test_deleted_input_fails_validation(batch_server: LiveServer) -> None:
    c = client(batch_server.base_url)
    f = c.files.create(file=("a.jsonl", jsonl([chat_line("a")])), purpose="batch")
    r = httpx.post(
        batch_server.base_url + "/batches",
        json={"input_file_id": f.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
    )
    assert r.status_code == 200
    c.files.delete(f.id)  # it may still validate first: either way, never a 500
    b = wait(c, r.json()["id"])
    assert b.status in ("failed", "completed")
    if b.status == "failed":
        assert b.errors.data[0].code == "file_not_found"


def test_window_seconds() -> None:
    assert [window_seconds(w) for w in ("24h", "90s", "5m", "2d")] == [86400, 90, 300, 172800]
    for bad in ("", "24", "h", "0s", "31d", 24, None, json, "\u0663h", "\uff11h"):  # (digits: ASCII only)
        with pytest.raises(ValueError):
            window_seconds(bad)


def test_hostile_lines_fail_the_batch_line_by_line_never_wedge_it(batch_server: LiveServer) -> None:
    c = client(batch_server.base_url)
    good = json.dumps(chat_line("fine-1"))
    lines = [
        good,
        '{"custom_id": "deep", "method": "POST", "url": "/v1/chat/completions", "body": '
        + "[" * 5000
        + "]" * 5000
        + "}",
        good.replace('"fine-1"', '"\\ud800"', 1),  # a lone surrogate as the custom_id
        json.dumps(chat_line("sur")).replace(
            '"content": "sur"', '"content": "\\udfff"'
        ),  # ... and in the body
        json.dumps(chat_line("big")).replace(
            '"max_tokens": 3', '"max_tokens": 3, "temperature": 1' + "0" * 400
        ),
        json.dumps(chat_line("inf")).replace('"max_tokens": 3', '"max_tokens": 3, "top_p": 1e999'),
    ]
    b = wait(c, submit(c, lines).id, timeout_s=20)
    assert b.status == "failed"
    got = [(e.line, e.code, e.param) for e in b.errors.data]
    assert got == [
        (2, "invalid_json_line", None),
        (3, "invalid_json_line", "custom_id"),
        (4, "invalid_json_line", "body.messages[0].content"),
        (5, "invalid_json_line", "body.temperature"),
        (6, "invalid_json_line", "body.top_p"),
    ]
    err = lines_of(c, b.error_file_id)
    assert [e["error"]["line"] for e in err] == [2, 3, 4, 5, 6]
    assert all(e["custom_id"] is None for e in err)  # none of them could be read
