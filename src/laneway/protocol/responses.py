"""OpenAI response objects: completions, chat completions, embeddings, their stream chunks.

:class:`Shape` makes the objects of one response. For the built-in engines it
builds them from the job's events; for an upstream's answer it only puts
laneway's id, model name and creation time on the upstream's own objects
(:meth:`Shape.own`), so that a response resumed on a second run still reads
as one. Every final object and the stream's last chunk carry the
``laneway`` object (:func:`extension`).
"""

from __future__ import annotations

from typing import Any, Protocol

from laneway.generation import CHAT, Done, Ending, ResumeMethod, TokenLogprob, Usage
from laneway.protocol import json_fast

DONE_LINE = b"data: [DONE]\n\n"


class Tracked(Protocol):
    """What the ``laneway`` object reports of a request (the runtime's ticket has it)."""

    class_name: str
    queue_s: float
    preemptions: int
    worker: str | None
    resume: ResumeMethod


def usage(u: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
    }


def extension(t: Tracked) -> dict[str, Any]:
    """The ``laneway`` object: class, time queued, preemptions, last worker, how a preemption resumes."""
    return {
        "priority": t.class_name,
        "queue_ms": round(t.queue_s * 1000.0, 3),
        "preemptions": t.preemptions,
        "worker": t.worker,
        "resume": t.resume,
    }


def _top(entries: tuple[tuple[str, float, tuple[int, ...]], ...]) -> list[dict[str, Any]]:
    return [{"token": tok, "logprob": lp, "bytes": list(b)} for tok, lp, b in entries]


def chat_logprobs(items: tuple[TokenLogprob, ...]) -> dict[str, Any]:
    content = [
        {"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes), "top_logprobs": _top(t.top)}
        for t in items
    ]
    return {"content": content, "refusal": None}


class Shape:
    """Builds the objects of one response (``kind``: chat, completion or embedding)."""

    def __init__(self, kind: str, rid: str, model: str, created: int, service_tier: object = None) -> None:
        self.kind = kind
        self.chat = kind == CHAT
        self.id = rid
        self.model = model
        self.created = created
        # the service_tier the client asked for, as OpenAI says it back ("auto": "default");
        # None: none asked for, none said
        self.tier = (
            ("default" if service_tier == "auto" else service_tier) if isinstance(service_tier, str) else None
        )
        self._offsets: dict[int, int] = {}  # completions logprobs: text offset per choice

    def _head(self, obj: str) -> dict[str, Any]:
        head = {"id": self.id, "object": obj, "created": self.created, "model": self.model}
        if self.tier is not None:
            head["service_tier"] = self.tier
        return head

    def own(self, obj: dict[str, Any]) -> dict[str, Any]:
        """An upstream's object with laneway's id, model name and creation time
        (an embedding list has only the model)."""
        obj["model"] = self.model
        if obj.get("object") != "list":
            obj["id"] = self.id
            obj["created"] = self.created
            if self.tier is not None:
                obj["service_tier"] = self.tier
        return obj

    # ------------------------------------------------------------ logprobs
    def _completion_logprobs(self, index: int, items: tuple[TokenLogprob, ...]) -> dict[str, Any]:
        offset = self._offsets.get(index, 0)
        offsets = []
        for t in items:
            offsets.append(offset)
            offset += len(t.token)
        self._offsets[index] = offset
        return {
            "tokens": [t.token for t in items],
            "token_logprobs": [t.logprob for t in items],
            "top_logprobs": [{tok: lp for tok, lp, _ in t.top} for t in items],
            "text_offset": offsets,
        }

    def _logprobs(self, index: int, items: tuple[TokenLogprob, ...] | None) -> dict[str, Any] | None:
        if items is None:
            return None
        return chat_logprobs(items) if self.chat else self._completion_logprobs(index, items)

    # ------------------------------------------------------------ whole answers
    def final(self, done: Done, ext: dict[str, Any]) -> dict[str, Any]:
        """The non-streamed answer: the upstream's (owned) or one built from ``done``."""
        if done.response is not None:
            body = self.own(done.response)
        else:
            body = self._head("chat.completion" if self.chat else "text_completion")
            self._offsets.clear()
            choices = []
            for e in _endings(done):
                choice: dict[str, Any] = {"index": e.index}
                if self.chat:
                    choice["message"] = {"role": "assistant", "content": e.text, "refusal": None}
                else:
                    choice["text"] = e.text
                choice["logprobs"] = self._logprobs(e.index, e.logprobs)
                choice["finish_reason"] = e.finish_reason
                if e.token_ids is not None:
                    choice["token_ids"] = list(e.token_ids)
                    if not self.chat and done.prompt_ids is not None:
                        choice["prompt_token_ids"] = list(done.prompt_ids)
                choices.append(choice)
            if self.chat and done.prompt_ids is not None:
                body["prompt_token_ids"] = list(done.prompt_ids)
            body["choices"] = choices
            body["usage"] = usage(done.usage)
        body["laneway"] = ext
        return body

    # ------------------------------------------------------------ stream chunks
    def chunk(
        self,
        text: str | None,
        finish: str | None = None,
        *,
        first: bool = False,
        index: int = 0,
        logprobs: tuple[TokenLogprob, ...] | None = None,
        token_ids: tuple[int, ...] | None = None,
        prompt_ids: tuple[int, ...] | None = None,
    ) -> dict[str, Any]:
        if self.chat:
            body = self._head("chat.completion.chunk")
            delta: dict[str, Any] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": index, "delta": delta}
        else:
            body = self._head("text_completion")
            choice = {"index": index, "text": text or ""}
        choice["logprobs"] = self._logprobs(index, logprobs)
        choice["finish_reason"] = finish
        if token_ids is not None:
            choice["token_ids"] = list(token_ids)
        if prompt_ids is not None:  # with the first chunk (of the answer: chat; of the choice: text)
            (body if self.chat else choice)["prompt_token_ids"] = list(prompt_ids)
        body["choices"] = [choice]
        return body

    def usage_chunk(self, u: Usage) -> dict[str, Any]:
        body = self._head("chat.completion.chunk" if self.chat else "text_completion")
        body["choices"] = []
        body["usage"] = usage(u)
        return body

    def last_chunks(self, done: Done, ext: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
        """The end of a stream: the chunk(s) that finish it, then usage if asked (an
        upstream's own chunks where it sent them). The ``laneway`` object is on the first
        chunk that finishes and on the last one, so a client reading either finds it."""
        if done.chunks:
            out = [self.own(c) for c in done.chunks]
            first = 0
        else:
            empty = None if self.chat else ""
            out = [self.chunk(empty, e.finish_reason, index=e.index) for e in _endings(done)]
            first = len(out) - 1
            if include_usage:
                out.append(self.usage_chunk(done.usage))
        out[first]["laneway"] = ext
        out[-1]["laneway"] = ext
        return out


def _endings(done: Done) -> tuple[Ending, ...]:
    return done.choices or (Ending(0, done.text, done.finish_reason),)


def event_sse(obj: dict[str, Any]) -> bytes:
    """An event named by its ``type`` (the Responses API's, Anthropic's), then its data; a
    ``type`` that could not be an event name gives an unnamed one."""
    kind = obj.get("type")
    if isinstance(kind, str) and kind.isascii() and kind.isprintable():
        return b"event: " + kind.encode() + b"\n" + sse(obj)
    return sse(obj)


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json_fast.dumps(obj, ascii=True) + b"\n\n"
