"""Requests to vLLM directly and through laneway, and a preempted run."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from laneway.config import ServerConfig, WorkerConfig
from laneway.testing import VLLM_MODEL_NAME
from live_server import LiveServer

TIMEOUT_S = 120.0
PATHS = {"chat": "/chat/completions", "completion": "/completions"}
# one client for every request: making one loads the CA bundle, which takes a second or
# more on a machine whose cores a generating vLLM keeps busy (a P0 would come too late)
CLIENT = httpx.Client(timeout=TIMEOUT_S)


def post(base: str, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    r = CLIENT.post(base + PATHS[kind], json=body)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def stream(base: str, kind: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every chunk of a streamed answer (the ``[DONE]`` line checked, not returned)."""
    chunks: list[dict[str, Any]] = []
    done = False
    with CLIENT.stream("POST", base + PATHS[kind], json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            assert not done, "a chunk after [DONE]"
            chunks.append(json.loads(line[6:]))
    assert done, "no [DONE]"
    return chunks


def text_of(answer: dict[str, Any], index: int = 0) -> str:
    choice = next(c for c in answer["choices"] if c["index"] == index)
    return choice["text"] if "text" in choice else choice["message"]["content"]


def streamed_text(chunks: list[dict[str, Any]], index: int = 0) -> str:
    out = []
    for c in chunks:
        for choice in c.get("choices") or ():
            if choice["index"] == index:
                out.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return "".join(out)


def preempted(
    server: LiveServer, kind: str, body: dict[str, Any], *, streaming: bool, after_tokens: int = 40
) -> tuple[Any, dict[str, Any]]:
    """Run ``body`` at P3 on ``server`` (1 slot); once it made ``after_tokens``, a P0 arrives
    and takes the slot. Returns (the P3's answer or chunks, the P0's answer)."""
    out: list[Any] = []
    low = {**body, "priority": "P3"}

    def run() -> None:
        try:
            out.append(stream(server.base_url, kind, low) if streaming else post(server.base_url, kind, low))
        except BaseException as exc:  # re-raised by the test's thread
            out.append(exc)

    t = threading.Thread(target=run)
    t.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not out:
            if any(tk.tokens >= after_tokens for tk in list(server.runtime.tickets.values())):
                break
            time.sleep(0.005)
        else:
            raise AssertionError(f"the P3 request never got going: {out}")
        urgent = {**body, "max_tokens": 5, "priority": "P0", "stream": False}
        urgent.pop("stream_options", None)
        p0 = post(server.base_url, kind, urgent)
    finally:
        t.join(TIMEOUT_S)
    assert out, "the P3 request did not finish"
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0], p0


def upstream_config(tmp_path: Path, url: str, slots: int = 2, **kw: object) -> ServerConfig:
    worker = WorkerConfig(
        "v0", type="upstream", url=url, model=VLLM_MODEL_NAME, served_name="tiny", slots=slots
    )
    return replace(ServerConfig(), workers=(replace(worker, **kw),), data_dir=tmp_path)  # type: ignore[arg-type]
