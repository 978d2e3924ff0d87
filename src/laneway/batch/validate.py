"""Checking a batch input file (OpenAI's JSONL) before any line runs.

Each line is ``{"custom_id": str, "method": "POST", "url": ENDPOINT, "body": {...}}``
where ``url`` is the batch's endpoint and ``body`` a request that endpoint
would accept (the same parsing as the live API: model served, parameters in
range, no streaming). Every bad line is reported with its 1-based line number;
one bad line fails the whole batch, as OpenAI does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from laneway.config.schema import ServerConfig
from laneway.errors import InvalidRequest, ModelNotFound, RequestError
from laneway.generation import CHAT, COMPLETION, EMBEDDING, RESPONSES
from laneway.protocol import json_input
from laneway.protocol.json_input import BadJSON
from laneway.protocol.requests import Parsed, Support, model_of, parse_request
from laneway.protocol.responses_api import ResponsesRequest, chat_body, forwarded_job, read_responses
from laneway.store.base import NewLine

# endpoint -> the kind of request its lines are
ENDPOINTS = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": COMPLETION,
    "/v1/embeddings": EMBEDDING,
    "/v1/responses": RESPONSES,
}
MAX_CUSTOM_ID = 512


@dataclass
class Validated:
    lines: list[NewLine] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)  # {"code", "line", "message", "param"}
    custom_ids: dict[int, str] = field(default_factory=dict)  # line -> custom_id, where one was read

    def bad(self, line: int | None, code: str, message: str, param: str | None = None) -> None:
        where = f"line {line}: " if line is not None else ""
        self.errors.append({"code": code, "line": line, "message": where + message, "param": param})


def validate_input(
    content: bytes, endpoint: str, config: ServerConfig, support: Mapping[str, Support]
) -> Validated:
    out = Validated()
    content = content.removeprefix(b"\xef\xbb\xbf")  # (a UTF-8 byte order mark, as some editors write)
    bad_at = content.find(b"\0")  # (JSON text holds no NUL: UTF-16 or -32, whose ASCII is UTF-8)
    why = "it holds NUL bytes: UTF-16 or UTF-32?"
    try:
        content.decode("utf-8")
    except UnicodeDecodeError as exc:
        if bad_at < 0 or exc.start < bad_at:
            bad_at, why = exc.start, f"byte {exc.start} is not UTF-8"
    if bad_at >= 0:  # (a file in UTF-16 would fail each line as some other thing)
        at = content.count(b"\n", 0, bad_at) + 1
        out.bad(at, "invalid_file_encoding", f"the file is not UTF-8 text ({why})")
        return out
    kind = ENDPOINTS[endpoint]
    limit = config.batches.max_lines
    seen: dict[str, int] = {}
    count = 0
    for number, raw in enumerate(content.split(b"\n"), start=1):
        if not raw.strip():
            continue
        count += 1
        if count > limit:
            continue
        if len(raw) > config.max_body_bytes:
            out.bad(
                number,
                "line_too_large",
                f"the line is {len(raw)} bytes; the limit is {config.max_body_bytes} "
                "([server] max_body_bytes, as for a request's body)",
            )
            continue
        try:
            obj = json_input.loads(raw, "the line")
        except BadJSON as exc:  # (its message names the place; param too)
            out.bad(number, "invalid_json_line", exc.message, exc.param)
            continue
        if not isinstance(obj, dict):
            out.bad(number, "invalid_json_line", "each line must be a JSON object")
            continue
        line = _check_line(out, number, obj, endpoint, kind, config, support)
        if line is None:
            continue
        first = seen.get(line.custom_id)
        if first is not None:
            out.bad(
                number,
                "duplicate_custom_id",
                f"custom_id {line.custom_id!r} is also on line {first}",
                "custom_id",
            )
            continue
        seen[line.custom_id] = number
        out.lines.append(line)
    if count > limit:
        out.bad(None, "too_many_requests", f"the file has {count} requests; a batch may have at most {limit}")
    elif count == 0:
        out.bad(None, "empty_file", "the input file has no requests")
    return out


def _check_line(
    out: Validated,
    number: int,
    obj: dict[str, Any],
    endpoint: str,
    kind: str,
    config: ServerConfig,
    support: Mapping[str, Support],
) -> NewLine | None:
    cid = obj.get("custom_id")
    if not isinstance(cid, str) or not cid or len(cid) > MAX_CUSTOM_ID:
        out.bad(
            number,
            "invalid_custom_id",
            f"custom_id must be a string of 1–{MAX_CUSTOM_ID} characters",
            "custom_id",
        )
        return None
    out.custom_ids[number] = cid
    if obj.get("method", "POST") != "POST":
        out.bad(number, "invalid_method", f"method must be POST, got {obj.get('method')!r}", "method")
        return None
    if obj.get("url") != endpoint:
        out.bad(
            number,
            "invalid_url",
            f"url must be the batch's endpoint {endpoint}, got {obj.get('url')!r}",
            "url",
        )
        return None
    body = obj.get("body")
    if not isinstance(body, dict):
        out.bad(number, "invalid_body", "body must be a JSON object (the request)", "body")
        return None
    if body.get("stream"):
        out.bad(number, "invalid_request", "streaming is not available in a batch", "body.stream")
        return None
    try:
        parse_line(body, kind, config, support)
    except ModelNotFound as exc:
        out.bad(number, "model_not_found", exc.message, "body.model")
        return None
    except RequestError as exc:
        out.bad(
            number, exc.code or "invalid_request", exc.message, f"body.{exc.param}" if exc.param else "body"
        )
        return None
    return NewLine(number, cid, json.dumps(body, separators=(",", ":"), ensure_ascii=False))


def parse_line(
    body: Mapping[str, Any], kind: str, config: ServerConfig, support: Mapping[str, Support]
) -> tuple[Parsed, ResponsesRequest | None]:
    """A line's request, and for a Responses line what its answer is made from. A line stands
    alone: it cannot continue a stored response (``previous_response_id``), nor is it stored."""
    if kind != RESPONSES:
        return parse_request(body, kind, config, support), None
    model, served = model_of(body, support, config.aliases)
    req = read_responses(body, engine=not served.passthrough)
    if req.previous_response_id is not None:
        raise InvalidRequest(
            "previous_response_id is not available in a batch line (each line stands alone)",
            param="previous_response_id",
        )
    if served.passthrough:
        return Parsed(forwarded_job(req, model, []), False, False, True), req
    return parse_request(chat_body(req, []), CHAT, config, support), req
