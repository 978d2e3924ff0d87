"""The Responses API's answers: the response object at each status, its output message, its
usage, and the stream's events (``response.created`` … ``response.output_text.delta`` …
``response.completed``), each numbered (``sequence_number``); an upstream's own response put
under laneway's id (:func:`own`).

:mod:`laneway.protocol.responses_api` reads the request these answer.
"""

from __future__ import annotations

from typing import Any

from laneway.generation import Done, Usage
from laneway.protocol.responses import event_sse
from laneway.protocol.responses_api import MESSAGE_PREFIX, TEXT_FORMAT, ResponsesRequest, new_id


def own(req: ResponsesRequest, response: dict[str, Any]) -> dict[str, Any]:
    """An upstream's response object (or one an event of its carries) under laneway's id, the
    client's model name, the conversation and storage as the client asked them (laneway
    stores it, not the upstream: asked not to)."""
    response["id"] = req.id
    response["model"] = req.model
    response["previous_response_id"] = req.previous_response_id
    response["store"] = req.store
    return response


def forwarded_final(
    req: ResponsesRequest, response: dict[str, Any], ext: dict[str, Any], stored: bool
) -> dict[str, Any]:
    """An upstream's response object as laneway answers it: laneway's id (the one stored), the
    conversation as the client asked it, whether it is stored, the ``laneway`` object."""
    own(req, response)
    response["store"] = stored
    response["laneway"] = ext
    return response


def usage_of(u: Usage) -> dict[str, Any]:
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    }


def output_message(msg_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = (
        [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    )
    return {"id": msg_id, "type": "message", "role": "assistant", "status": status, "content": content}


def failure_code(code: str | None) -> str:
    """A failed response's ``error.code``: one of the spec's codes."""
    return "rate_limit_exceeded" if code == "rate_limit_exceeded" else "server_error"


class Answer:
    """The objects of one response: the response (at each status) and its stream's events."""

    def __init__(
        self, req: ResponsesRequest, model: str, created_at: int, service_tier: object = None
    ) -> None:
        self.req = req
        self.model = model
        self.created_at = created_at
        self.msg_id = new_id(MESSAGE_PREFIX)
        self.tier = (
            ("default" if service_tier == "auto" else service_tier)
            if isinstance(service_tier, str)
            else "default"
        )
        self.seq = 0

    def response(
        self,
        status: str,
        *,
        text: str | None = None,
        usage: Usage | None = None,
        finish: str | None = None,
        completed_at: int | None = None,
        error: dict[str, str] | None = None,
        store: bool | None = None,
        ext: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The response object; ``text``: its output (none while in progress)."""
        req = self.req
        incomplete = finish == "length"
        if status == "completed" and incomplete:
            status = "incomplete"
        item_status = "completed" if status == "completed" else "incomplete"  # (an item's statuses)
        output = [] if text is None else [output_message(self.msg_id, text, item_status)]
        obj: dict[str, Any] = {
            "id": req.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": completed_at if status == "completed" else None,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": req.previous_response_id,
            "reasoning": None,
            "service_tier": self.tier,
            "store": req.store if store is None else store,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": TEXT_FORMAT,
            "tool_choice": "auto",
            "tools": [],
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "truncation": "disabled",
            "metadata": req.metadata,
        }
        obj.update(req.echoed)  # (what the request set of those above, and of optional ones)
        if usage is not None:  # (none until it is done)
            obj["usage"] = usage_of(usage)
        if req.user is not None:
            obj["user"] = req.user
        if ext is not None:
            obj["laneway"] = ext
        return obj

    def finished(
        self, done: Done, ext: dict[str, Any], *, forwarded: bool, now: int, store: bool | None = None
    ) -> dict[str, Any]:
        """The finished response: an upstream's own (``forwarded``: its Responses API answered),
        or one made from ``done`` (the chat path)."""
        if forwarded and done.response is not None:
            return forwarded_final(self.req, done.response, ext, bool(store))
        return self.response(
            "completed",
            text=done.text,
            usage=done.usage,
            finish=done.finish_reason,
            completed_at=now,
            store=store,
            ext=ext,
        )

    # ------------------------------------------------------------ stream events
    def event(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, **fields, "sequence_number": self.seq}
        self.seq += 1
        return event_sse(body)

    def opening(self) -> list[bytes]:
        """The events before the first text: created, in progress, the message and its part begun."""
        begun = self.response("in_progress")
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self.event("response.created", response=begun),
            self.event("response.in_progress", response=begun),
            self.event(
                "response.output_item.added",
                output_index=0,
                item=output_message(self.msg_id, None, "in_progress"),
            ),
            self.event(
                "response.content_part.added", item_id=self.msg_id, output_index=0, content_index=0, part=part
            ),
        ]

    def delta(self, text: str) -> bytes:
        return self.event(
            "response.output_text.delta",
            item_id=self.msg_id,
            output_index=0,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def closing(self, final: dict[str, Any]) -> list[bytes]:
        """The events after the last text, ending with the final response (completed or incomplete)."""
        item = final["output"][0]
        part = item["content"][0]
        where = {"item_id": self.msg_id, "output_index": 0, "content_index": 0}
        last = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return [
            self.event("response.output_text.done", **where, text=part["text"], logprobs=[]),
            self.event("response.content_part.done", **where, part=part),
            self.event("response.output_item.done", output_index=0, item=item),
            self.event(last, response=final),
        ]

    def failure(
        self, code: str | None, message: str, param: str | None, text: str, ext: dict[str, Any]
    ) -> list[bytes]:
        """The events of an error after the stream began: ``error``, then ``response.failed``
        (with the ``laneway`` object ``ext``, as the last event's response always has)."""
        error = {"code": failure_code(code), "message": message}
        failed = self.response("failed", text=text, error=error, ext=ext)
        return [
            self.event("error", code=code, message=message, param=param),
            self.event("response.failed", response=failed),
        ]
