"""The official openai client against a live server: files, batches, results, cancel, expiry."""

from __future__ import annotations

import contextlib
import select
import socket
import time

import httpx
import openai
import pytest

from batch_util import chat_line, client, jsonl, lines_of, submit, wait
from live_server import LiveServer


def test_files_roundtrip(batch_server: LiveServer) -> None:
    c = client(batch_server.base_url)
    data = jsonl([chat_line("a")])
    f = c.files.create(file=("mine.jsonl", data), purpose="batch")
    assert f.object == "file" and f.purpose == "batch" and f.bytes == len(data) and f.filename == "mine.jsonl"
    assert c.files.retrieve(f.id).id == f.id
    assert c.files.content(f.id).content == data
    assert f.id in [x.id for x in c.files.list(purpose="batch")]
    deleted = c.files.delete(f.id)
    assert deleted.deleted and deleted.id == f.id
    with pytest.raises(openai.NotFoundError):
        c.files.retrieve(f.id)
    with pytest.raises(openai.NotFoundError):
        c.files.delete(f.id)


def test_batch_runs_to_completion_with_one_result_per_custom_id(batch_server: LiveServer) -> None:
    c = client(batch_server.base_url)
    lines = [
        chat_line(f"req-{i}", max_tokens=1 + i % 4, model="sim" if i else "sim-alias") for i in range(40)
    ]
    b = submit(c, lines, metadata={"team": "x"})
    assert b.status == "validating" and b.object == "batch" and b.metadata == {"team": "x"}
    assert b.expires_at - b.created_at == 86400 and b.model_extra["laneway"]["priority"] == "P2"
    b = wait(c, b.id)
    assert b.status == "completed" and b.error_file_id is None
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (40, 40, 0)
    assert b.in_progress_at is not None and b.finalizing_at is not None and b.completed_at is not None
    out = lines_of(c, b.output_file_id)
    assert [o["custom_id"] for o in out] == [f"req-{i}" for i in range(40)]  # input order
    used = [o["response"]["body"]["usage"] for o in out]
    assert b.usage is not None  # the batch adds up its lines' tokens
    assert b.usage.input_tokens == sum(u["prompt_tokens"] for u in used) > 0
    assert (
        b.usage.output_tokens
        == sum(u["completion_tokens"] for u in used)
        == sum(1 + i % 4 for i in range(40))
    )
    assert b.usage.total_tokens == b.usage.input_tokens + b.usage.output_tokens
    first = out[0]
    assert first["id"].startswith("batch_req_") and first["error"] is None
    resp = first["response"]
    assert resp["status_code"] == 200 and resp["request_id"] == resp["body"]["id"]
    assert resp["body"]["object"] == "chat.completion" and resp["body"]["usage"]["completion_tokens"] == 1
    assert resp["body"]["laneway"]["priority"] == "P2"
    assert resp["body"]["model"] == "sim-alias" and out[1]["response"]["body"]["model"] == "sim"
    meta = c.files.retrieve(b.output_file_id)
    assert meta.purpose == "batch_output" and meta.filename == f"{b.id}_output.jsonl"


def test_completions_endpoint_priority_and_list_pages(batch_server: LiveServer) -> None:
    c = client(batch_server.base_url)
    line = {
        "custom_id": "p",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": "sim", "prompt": "x", "max_tokens": 2},
    }
    ids = [submit(c, [line], endpoint="/v1/completions", metadata={"priority": "P3"}).id for _ in range(3)]
    done = [wait(c, i) for i in ids]
    assert all(b.status == "completed" and b.model_extra["laneway"]["priority"] == "P3" for b in done)
    body = lines_of(c, done[0].output_file_id)[0]["response"]["body"]
    assert body["object"] == "text_completion" and body["laneway"]["priority"] == "P3"
    page = c.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[::-1][:2] and page.has_more
    rest = c.batches.list(limit=2, after=page.data[-1].id)
    assert rest.data[0].id == ids[0]
    seen = [b.id for b in c.batches.list(limit=1)]  # the client pages through every batch
    assert seen[:3] == ids[::-1]
    raw = httpx.get(batch_server.base_url + "/batches", params={"limit": 2}).json()
    assert raw["first_id"] == ids[2] and raw["last_id"] == ids[1] and raw["has_more"] is True


def test_responses_lines(batch_server: LiveServer) -> None:
    """Lines may target the Responses API: each answered with a response object (not stored);
    one that would continue a stored response is refused at validation, naming the field."""
    c = client(batch_server.base_url)

    def line(cid: str, **body: object) -> dict[str, object]:
        return {
            "custom_id": cid,
            "method": "POST",
            "url": "/v1/responses",
            "body": {"model": "sim", "input": cid, "max_output_tokens": 3, **body},
        }

    lines = [line("a"), line("b", instructions="short", model="sim-alias")]
    b = wait(c, submit(c, lines, endpoint="/v1/responses").id)
    assert b.status == "completed" and b.request_counts.completed == 2
    out = lines_of(c, b.output_file_id)
    bodies = [o["response"]["body"] for o in out]
    assert [x["model"] for x in bodies] == ["sim", "sim-alias"]  # (the name each line used)
    assert [o["response"]["request_id"] for o in out] == [x["id"] for x in bodies]
    assert all(x["object"] == "response" and x["id"].startswith("resp_") for x in bodies)
    assert [x["usage"]["output_tokens"] for x in bodies] == [3, 3] and bodies[1]["instructions"] == "short"
    assert all(x["output"][0]["content"][0]["text"] and x["store"] is False for x in bodies)
    assert bodies[0]["laneway"]["priority"] == "P2"
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(bodies[0]["id"])
    bad = wait(c, submit(c, [line("c", previous_response_id="resp_x")], endpoint="/v1/responses").id)
    assert bad.status == "failed" and bad.errors is not None
    [error] = bad.errors.data
    assert error.param == "body.previous_response_id" and error.line == 1


def test_cancel_keeps_results_so_far(batch_server: LiveServer) -> None:
    c = client(batch_server.base_url)
    b = submit(c, [chat_line(f"c{i}", max_tokens=200) for i in range(60)])  # ~0.4 s a line, 4 at a time
    wait(c, b.id, until=["in_progress"])
    cancelled = c.batches.cancel(b.id)
    assert cancelled.status in ("cancelling", "cancelled")
    b = wait(c, b.id)
    assert b.status == "cancelled" and b.cancelled_at is not None
    counts = b.request_counts
    assert counts.total == 60 and counts.completed + counts.failed == 60 and counts.completed < 60
    out, err = lines_of(c, b.output_file_id), lines_of(c, b.error_file_id)
    ids = [x["custom_id"] for x in out + err]
    assert sorted(ids) == sorted(f"c{i}" for i in range(60))  # each exactly once
    assert {e["error"]["code"] for e in err} == {"batch_cancelled"}
    with pytest.raises(openai.ConflictError):  # again, once it has ended: 409 (the README's promise)
        c.batches.cancel(b.id)
    finished = wait(c, submit(c, [chat_line("one")]).id)
    with pytest.raises(openai.ConflictError):
        c.batches.cancel(finished.id)


def test_a_batch_cancelled_at_once_answers_every_line_in_one_of_its_files(batch_server: LiveServer) -> None:
    """Cancelled as soon as it is made (while it is validated, or as it starts): every
    custom_id is in one of its two files all the same, those that never ran batch_cancelled
    (cancelled while validated, its lines were lost: total 0, no file)."""
    c = client(batch_server.base_url)
    for attempt in range(4):
        ids = [f"a{attempt}-{i}" for i in range(300)]
        b = submit(c, [chat_line(cid, max_tokens=200) for cid in ids])
        c.batches.cancel(b.id)
        b = wait(c, b.id)
        assert b.status == "cancelled", b
        assert b.request_counts.total == 300, b.request_counts
        out = lines_of(c, b.output_file_id) if b.output_file_id else []
        err = lines_of(c, b.error_file_id) if b.error_file_id else []
        assert sorted(x["custom_id"] for x in out + err) == sorted(ids)
        assert {e["error"]["code"] for e in err} <= {"batch_cancelled"}


def test_expiry_keeps_partial_results(batch_server: LiveServer) -> None:
    c = client(batch_server.base_url)
    # 0.4 s a line, 4 at a time: 4 s in all; the window ends 1–2 s after creation
    b = submit(c, [chat_line(f"e{i}", max_tokens=200) for i in range(40)], completion_window="2s")
    b = wait(c, b.id, timeout_s=15)
    assert b.status == "expired" and b.expired_at is not None
    assert 0 < b.request_counts.completed < 40
    assert b.request_counts.completed + b.request_counts.failed == 40
    out, err = lines_of(c, b.output_file_id), lines_of(c, b.error_file_id)
    assert sorted(x["custom_id"] for x in out + err) == sorted(f"e{i}" for i in range(40))
    assert err and all(e["error"]["code"] == "batch_expired" and e["response"] is None for e in err)


def _metric(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not in /metrics")


def test_batch_lines_are_counted_in_metrics(batch_server: LiveServer) -> None:
    url = batch_server.url + "/metrics"
    before = httpx.get(url).text
    c = client(batch_server.base_url)
    b = wait(c, submit(c, [chat_line(f"m-{i}") for i in range(6)]).id)
    assert b.status == "completed"
    after = httpx.get(url).text
    done = 'laneway_batch_lines_total{outcome="completed"}'
    assert _metric(after, done) - _metric(before, done) == 6
    failed = 'laneway_batch_lines_total{outcome="failed"}'
    assert _metric(after, failed) == _metric(before, failed)  # every line of this batch answered
    assert _metric(after, "laneway_batch_lines_running") == 0


def test_a_chunked_upload_past_the_limit_is_refused_as_it_arrives(batch_server: LiveServer) -> None:
    """No length given: the 413 comes once the limit (256 KiB here) is passed, while the client
    is still sending, not after the whole body (200 MiB) was spooled to disk."""
    host, port = batch_server.url.removeprefix("http://").split(":")
    boundary = "b0undary"
    head = (
        f"POST /v1/files HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\n\r\n"
    ).encode()
    part = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n'
        "Content-Type: application/jsonl\r\n\r\n"
    ).encode()
    piece = b"x" * (72 << 10)  # 72 KiB of one line (a file of too many lines is refused sooner)
    sent = 0
    answer = b""
    pending = b""
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(head + b"%x\r\n%s\r\n" % (len(part), part))
        deadline = time.monotonic() + 60
        while sent < 200 << 20 and time.monotonic() < deadline:
            readable, writable, _ = select.select([s], [s], [], 1.0)
            if readable:
                answer = s.recv(65536)
                break
            if writable:
                if not pending:
                    pending = b"%x\r\n%s\r\n" % (len(piece), piece)
                n = s.send(pending)
                pending = pending[n:]
                sent += n
        with contextlib.suppress(OSError):
            s.settimeout(5)
            answer += s.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"payload_too_large" in answer
    assert sent < 32 << 20, f"{sent >> 20} MiB were sent before the answer"
