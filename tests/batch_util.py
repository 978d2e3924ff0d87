"""Helpers of the batch tests: input files, the openai client, waiting for a batch to end."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

import openai

ENDED = ("completed", "failed", "expired", "cancelled")


def client(base_url: str, key: str = "unused") -> openai.OpenAI:
    """(Closed after the test: conftest.py.)"""
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=30)


def chat_line(cid: str, max_tokens: int = 3, model: str = "sim", **body: Any) -> dict[str, Any]:
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": model,
            "messages": [{"role": "user", "content": cid}],
            "max_tokens": max_tokens,
            **body,
        },
    }


def jsonl(lines: Iterable[object]) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


def submit(c: openai.OpenAI, lines: Iterable[object], **kw: Any) -> Any:
    f = c.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch")
    kw.setdefault("completion_window", "24h")
    kw.setdefault("endpoint", "/v1/chat/completions")
    return c.batches.create(input_file_id=f.id, **kw)


def wait(c: openai.OpenAI, batch_id: str, until: Iterable[str] = ENDED, timeout_s: float = 30.0) -> Any:
    statuses = tuple(until)
    deadline = time.monotonic() + timeout_s
    while True:
        b = c.batches.retrieve(batch_id)
        if b.status in statuses:
            return b
        assert time.monotonic() < deadline, f"batch {batch_id} still {b.status}: {b.request_counts}"
        time.sleep(0.05)


def lines_of(c: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in c.files.content(file_id).text.splitlines()]
