"""OpenAI response objects: completions, chat completions, their stream chunks."""

from __future__ import annotations

import json
from typing import Any

from laneway.generation import Usage
from laneway.runtime.ticket import Ticket

DONE_LINE = b"data: [DONE]\n\n"


def usage(u: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
    }


def extension(ticket: Ticket) -> dict[str, Any]:
    """The ``laneway`` object: class, time queued, preemptions, last worker."""
    return {
        "priority": ticket.class_name,
        "queue_ms": round(ticket.queue_s * 1000.0, 3),
        "preemptions": ticket.preemptions,
        "worker": ticket.worker,
    }


class Shape:
    """Builds the objects of one response (chat or text completion)."""

    def __init__(self, chat: bool, rid: str, model: str, created: int) -> None:
        self.chat = chat
        self.id = rid
        self.model = model
        self.created = created

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def final(self, text: str, finish: str, u: Usage, ticket: Ticket) -> dict[str, Any]:
        if self.chat:
            body = self._head("chat.completion")
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            body = self._head("text_completion")
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        body["choices"] = [choice]
        body["usage"] = usage(u)
        body["laneway"] = extension(ticket)
        return body

    def chunk(self, text: str | None, finish: str | None = None, *, first: bool = False) -> dict[str, Any]:
        if self.chat:
            body = self._head("chat.completion.chunk")
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            body["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        else:
            body = self._head("text_completion")
            body["choices"] = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]
        return body

    def usage_chunk(self, u: Usage) -> dict[str, Any]:
        body = self._head("chat.completion.chunk" if self.chat else "text_completion")
        body["choices"] = []
        body["usage"] = usage(u)
        return body


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode("utf-8") + b"\n\n"
