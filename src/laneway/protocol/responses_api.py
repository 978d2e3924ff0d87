"""The Responses API (``/v1/responses``) read into a chat request, and its answers.

A Responses request is served from the chat path: :func:`read_responses`
checks its fields and turns its ``input`` (a string, or a list of message
items) into chat messages; :func:`chat_body` puts them after the
conversation so far (``previous_response_id``: the messages of the stored
responses before it) and after ``instructions`` (a system message, not
carried to the next turn, as OpenAI does). What laneway schedules is then an
ordinary chat request, so classes, quotas, preemption and the ``laneway``
extension apply unchanged, on the built-in engine as on an upstream.

Only plain text in and out is served: a field that asks for more (tools,
reasoning, structured output, images and files, background runs) is refused
with a 400 naming it, never dropped silently.

:mod:`laneway.protocol.responses_answer` makes the answers.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from laneway.errors import InvalidRequest
from laneway.generation import RESPONSES, Job, ResumeRule, SamplingParams
from laneway.protocol.fields import OWNED
from laneway.protocol.values import MAX_TOKENS_LIMIT, flag, identifiers

RESPONSE_PREFIX = "resp_"
MESSAGE_PREFIX = "msg_"
MAX_METADATA_KEYS = 16

# fields read here (laneway's own too: they pick the class)
READ = frozenset(
    {
        "model",
        "input",
        "instructions",
        "previous_response_id",
        "store",
        "stream",
        "max_output_tokens",
        "temperature",
        "top_p",
        "metadata",
        "user",
        "service_tier",
        "priority",
        "preemptible",
        "laneway",
        "safety_identifier",
        "prompt_cache_key",
        "stream_options",
    }
)
TEXT_FORMAT = {"format": {"type": "text"}}
VERBOSITY = ("low", "medium", "high")
# what a response says back of its request, where given (beside its other fields)
ECHOED = (
    "parallel_tool_calls",
    "tool_choice",
    "top_logprobs",
    "background",
    "safety_identifier",
    "prompt_cache_key",
)


def _asks_nothing(name: str, value: object) -> bool:
    """Whether an optional field's value asks for nothing beyond plain text (accepted)."""
    if value is None:
        return True
    if name in ("tools", "include"):
        return value == []
    if name == "tool_choice":
        return value in ("auto", "none")
    if name in ("parallel_tool_calls", "background") and not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be true or false, got {value!r}", param=name)
    if name == "parallel_tool_calls":
        return True
    if name == "truncation":  # ("auto" drops the oldest items of a conversation too long: not done)
        return value == "disabled"
    if name == "background":
        return value is False
    if name == "reasoning":
        return isinstance(value, dict) and all(v is None for v in value.values())
    if name == "text":
        if not isinstance(value, dict):
            raise InvalidRequest(f"text must be an object, got {value!r}", param="text")
        verbosity = value.get("verbosity")
        if verbosity is not None and verbosity not in VERBOSITY:
            raise InvalidRequest(
                f"text.verbosity must be one of {', '.join(VERBOSITY)}, got {verbosity!r}",
                param="text.verbosity",
            )
        return (
            set(value) <= {"format", "verbosity"}
            and value.get("format", TEXT_FORMAT["format"]) == TEXT_FORMAT["format"]
        )
    if name in ("top_logprobs", "max_tool_calls"):
        return value == 0
    return False


OPTIONAL = frozenset(
    {
        "tools",
        "include",
        "tool_choice",
        "parallel_tool_calls",
        "truncation",
        "background",
        "reasoning",
        "text",
        "top_logprobs",
        "max_tool_calls",
    }
)


@dataclass(frozen=True)
class ResponsesRequest:
    """A Responses request, read: what its answer says back and what its chat request needs."""

    id: str
    model: str
    input_list: tuple[dict[str, Any], ...]  # the input as items (a string: one user message)
    input_items: tuple[dict[str, Any], ...]  # as stored and listed (each with its id)
    messages: tuple[dict[str, str], ...]  # the input as chat messages
    instructions: str | None
    previous_response_id: str | None
    store: bool
    stream: bool
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None
    metadata: dict[str, str]
    user: str | None
    body: Mapping[str, Any]
    echoed: Mapping[str, Any] = field(default_factory=dict)  # fields said back as given (ECHOED, text)


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


def _number(body: Mapping[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise InvalidRequest(f"{name} must be a number from {low:g} to {high:g}, got {value!r}", param=name)
    return float(value)


def _text_of(content: object, where: str, role: str) -> tuple[str, list[dict[str, Any]]]:
    """A message's content as text and as the content parts it is stored with."""
    kind = "output_text" if role == "assistant" else "input_text"
    if isinstance(content, str):
        part: dict[str, Any] = {"type": kind, "text": content}
        if kind == "output_text":
            part.update(annotations=[], logprobs=[])
        return content, [part]
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content must be a string or a list of content parts", param=where)
    texts = []
    parts = []
    for j, p in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(p, dict) or not isinstance(p.get("type"), str):
            raise InvalidRequest(f"{at} must be a content part object with a type", param=at)
        if p["type"] not in ("input_text", "output_text", "text"):
            raise InvalidRequest(
                f"{at}: content of type {p['type']!r} is not served (only text: input_text, output_text)",
                param=at,
            )
        text = p.get("text")
        if not isinstance(text, str):
            raise InvalidRequest(f"{at}.text must be a string", param=at)
        texts.append(text)
        stored: dict[str, Any] = {"type": kind, "text": text}
        if kind == "output_text":
            stored.update(annotations=[], logprobs=[])
        parts.append(stored)
    return "".join(texts), parts


def _input_list(value: object) -> list[dict[str, Any]]:
    """The ``input`` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidRequest("input must be a string or a non-empty list of input items", param="input")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise InvalidRequest(f"input[{i}] must be an input item object", param=f"input[{i}]")
    return value


def _items(
    value: list[dict[str, Any]], name: str = "input"
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Items of text messages as stored (each with an id) and as chat messages."""
    items = []
    messages = []
    for i, item in enumerate(value):
        where = f"{name}[{i}]"
        kind = item.get("type", "message")
        if kind != "message":
            raise InvalidRequest(
                f"{where}: items of type {kind!r} are not served (only messages of text)", param=where
            )
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise InvalidRequest(
                f"{where}.role must be one of user, assistant, system, developer, got {role!r}", param=where
            )
        text, parts = _text_of(item.get("content"), where, role)
        msg_id = new_id(MESSAGE_PREFIX)
        items.append({"id": msg_id, "type": "message", "role": role, "content": parts, "status": "completed"})
        messages.append({"role": "system" if role == "developer" else role, "content": text})
    return items, messages


def _listed(value: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items as given, for ``input_items``: each with an id (one made where it has none); a
    message in OpenAI's listed shape (a string content as one text part, a status), other
    items as they are (the upstream reads them)."""
    out = []
    for item in value:
        listed = {"type": "message", **item}
        if not isinstance(listed.get("id"), str):
            listed["id"] = new_id(MESSAGE_PREFIX)
        if listed["type"] == "message":
            content = listed.get("content")
            if isinstance(content, str):
                listed["content"] = _text_of(content, "input", str(listed.get("role")))[1]
            listed.setdefault("status", "completed")
        out.append(listed)
    return out


def _metadata(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if (
        not isinstance(value, dict)
        or len(value) > MAX_METADATA_KEYS
        or not all(
            isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
            for k, v in value.items()
        )
    ):
        raise InvalidRequest(
            f"metadata must be an object of at most {MAX_METADATA_KEYS} string values "
            "(keys up to 64 characters, values up to 512)",
            param="metadata",
        )
    return dict(value)


def read_responses(body: Mapping[str, Any], *, engine: bool = True) -> ResponsesRequest:
    """A Responses request's fields, checked (400 naming the field that is wrong or not served).

    ``engine``: for a built-in engine, served from the chat path (text only); else the request
    goes to an upstream's own Responses API, which checks what laneway does not read."""
    for name, value in body.items() if engine else ():
        if name in READ:
            continue
        if name in OPTIONAL and _asks_nothing(name, value):
            continue
        what = "this value of " if name in OPTIONAL else ""
        raise InvalidRequest(
            f"{what}{name} is not served by laneway's Responses API (it serves text in and text out)",
            param=name,
        )
    if (
        not engine
        and body.get("background") is not None
        and not _asks_nothing("background", body["background"])
    ):
        raise InvalidRequest(  # (it is sent streamed and unstored: the upstream would refuse it, unclearly)
            "background is not served through laneway (laneway streams each response itself and keeps "
            "it where store is true: send the request without background)",
            param="background",
        )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model is required (a string)", param="model")
    if "input" not in body:
        raise InvalidRequest("input is required", param="input")
    given = _input_list(body["input"])
    items, messages = _items(given) if engine else (_listed(given), [])
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest("instructions must be a string", param="instructions")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise InvalidRequest("previous_response_id must be a response id", param="previous_response_id")
    limit = body.get("max_output_tokens")
    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit < MAX_TOKENS_LIMIT
    ):
        raise InvalidRequest(
            f"max_output_tokens must be a whole number from 1 to {MAX_TOKENS_LIMIT - 1}, got {limit!r}",
            param="max_output_tokens",
        )
    identifiers(body)
    options = body.get("stream_options")
    if options is not None and (
        not isinstance(options, dict) or not isinstance(options.get("include_obfuscation", False), bool)
    ):
        raise InvalidRequest(
            'stream_options must be an object ({"include_obfuscation": true or false})',
            param="stream_options",
        )
    echoed = {name: body[name] for name in ECHOED if body.get(name) is not None} if engine else {}
    text = body.get("text")
    if engine and isinstance(text, dict):
        echoed["text"] = {
            **TEXT_FORMAT,
            **({"verbosity": text["verbosity"]} if text.get("verbosity") else {}),
        }
    elif isinstance(text, dict):  # (an upstream's: said back as asked where laneway answers itself)
        echoed["text"] = text
    return ResponsesRequest(
        id=new_id(RESPONSE_PREFIX),
        model=model,
        input_list=tuple(given),
        input_items=tuple(items),
        messages=tuple(messages),
        instructions=instructions,
        previous_response_id=previous,
        store=flag(body, "store", True),
        stream=flag(body, "stream", False),
        max_output_tokens=limit,
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 0.0, 1.0),
        metadata=_metadata(body.get("metadata")),
        user=body.get("user"),
        body=body,
        echoed=echoed,
    )


def context_after(
    req: ResponsesRequest, context: list[dict[str, Any]], output: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The conversation a later response continues, as input items: what came before, this
    input, this answer's output."""
    return [*context, *req.input_list, *output]


def chat_body(req: ResponsesRequest, context: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat completions request that serves ``req`` after the conversation ``context``."""
    try:
        earlier = _items(context, "previous_response_id")[1]
    except InvalidRequest as exc:  # (a conversation made by an upstream's Responses API)
        raise InvalidRequest(
            f"the conversation of previous_response_id holds what this model does not serve: {exc.message}",
            param="previous_response_id",
        ) from None
    messages: list[dict[str, str]] = []
    if req.instructions is not None:
        messages.append({"role": "system", "content": req.instructions})
    messages += earlier
    messages += req.messages
    chat: dict[str, Any] = {"model": req.model, "messages": messages}
    if req.stream:
        chat["stream"] = True
    if req.max_output_tokens is not None:
        chat["max_tokens"] = req.max_output_tokens
    for name in ("temperature", "top_p"):
        value = getattr(req, name)
        if value is not None:
            chat[name] = value
    for name in ("user", "priority", "preemptible", "laneway", "service_tier"):
        if req.body.get(name) is not None:
            chat[name] = req.body[name]
    return chat


# fields of a forwarded request laneway takes out: its own, and the state it keeps itself
NOT_FORWARDED = OWNED | {"previous_response_id", "store", "stream"}


def forwarded_job(req: ResponsesRequest, model: str, context: list[dict[str, Any]]) -> Job:
    """The job that sends ``req`` to an upstream's Responses API: as the client sent it, but
    with the conversation so far put before its input (the upstream keeps no state: laneway
    does, and any replica of the upstream may serve the next turn), and nothing stored there.
    It cannot be resumed part-way (no token ids): one not streamed restarts when preempted,
    a streamed one is not preempted."""
    body = {k: v for k, v in req.body.items() if k not in NOT_FORWARDED}
    if context:
        body["input"] = [*context, *req.input_list]
    body["store"] = False
    params = SamplingParams(
        max_tokens=req.max_output_tokens, temperature=1.0 if req.temperature is None else req.temperature
    )
    rule = ResumeRule.NONE if req.stream else ResumeRule.RESTART
    return Job(req.id, model, params, kind=RESPONSES, body=body, stream=req.stream, resume=rule)
