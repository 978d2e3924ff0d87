"""A stand-in engine's requests and its answers in vLLM's (OpenAI's) shapes, whole and
streamed, and the ASGI sends that carry them."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from laneway.standin_text import decode


@dataclass(eq=False)
class Seq:
    """A generation request as the stand-in holds it: its prompt's token ids, the tokens it is
    to write (``target``) and has written (``made``)."""

    prompt: list[int]
    target: int
    seed: int
    made: list[int] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    gone: bool = False
    key: str | None = None  # the prompt's first "#KEY#" (tests mark their requests so)
    opened: float = 0.0  # wall clock of its arrival

    @property
    def done(self) -> bool:
        return len(self.made) >= self.target


def head(meta: dict[str, Any], obj: str) -> dict[str, Any]:
    return {"id": meta["id"], "object": obj, "created": meta["created"], "model": meta["model"]}


def usage(seq: Seq) -> dict[str, int]:
    return {
        "prompt_tokens": len(seq.prompt),
        "completion_tokens": len(seq.made),
        "total_tokens": len(seq.prompt) + len(seq.made),
    }


def answer(seq: Seq, meta: dict[str, Any]) -> dict[str, Any]:
    text = decode(seq.made)
    if meta["chat"]:
        out = head(meta, "chat.completion")
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
    else:
        out = head(meta, "text_completion")
        choice = {"index": 0, "text": text}
    choice.update(logprobs=None, finish_reason="length")
    if meta["ids"]:
        choice["token_ids"] = seq.made
        (out if meta["chat"] else choice)["prompt_token_ids"] = seq.prompt
    out["choices"] = [choice]
    out["usage"] = usage(seq)
    return out


def chunk(seq: Seq, meta: dict[str, Any], new: list[int], first: bool) -> dict[str, Any]:
    text = decode(new) if new else ""
    if meta["chat"]:
        out = head(meta, "chat.completion.chunk")
        delta: dict[str, Any] = (
            {"role": "assistant", "content": ""} if first and not new else {"content": text}
        )
        choice: dict[str, Any] = {"index": 0, "delta": delta}
    else:
        out = head(meta, "text_completion")
        choice = {"index": 0, "text": text}
    choice.update(logprobs=None, finish_reason="length" if seq.done and new else None)
    if meta["ids"]:
        choice["token_ids"] = new
        if first:
            (out if meta["chat"] else choice)["prompt_token_ids"] = seq.prompt
    out["choices"] = [choice]
    return out


async def send_json(send: Any, status: int, obj: dict[str, Any]) -> None:
    body = json.dumps(obj, separators=(",", ":")).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


async def send_text(send: Any, status: int, text: str) -> None:
    body = text.encode()
    head = [(b"content-type", b"text/plain; version=0.0.4"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


async def send_sse(send: Any, obj: dict[str, Any]) -> None:
    data = b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
    await send({"type": "http.response.body", "body": data, "more_body": True})
