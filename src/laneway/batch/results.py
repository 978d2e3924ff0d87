"""Lines of a batch's output and error files, in OpenAI's format.

``{"id": "batch_req_…", "custom_id": …, "response": {"status_code", "request_id", "body"},
"error": null}`` for an answered request (the body is what the endpoint
would have answered; a non-2xx answer goes to the error file), and
``{"id", "custom_id", "response": null, "error": {"code", "message"}}`` for a
request that never got an answer (expired, cancelled, rejected in validation).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from laneway.errors import RequestError


def request_line_id() -> str:
    return "batch_req_" + uuid.uuid4().hex[:24]


def _dump(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def answered(custom_id: str, request_id: str, status: int, body: dict[str, Any]) -> str:
    response = {"status_code": status, "request_id": request_id, "body": body}
    return _dump({"id": request_line_id(), "custom_id": custom_id, "response": response, "error": None})


def refused(custom_id: str, request_id: str, exc: RequestError) -> str:
    """A request the server answered with an error (4xx/5xx) — the error file's line."""
    error = {"message": exc.message, "type": exc.type, "code": exc.code, "param": exc.param}
    return answered(custom_id, request_id, exc.status, {"error": error})


def unanswered(custom_id: str | None, code: str, message: str, line: int | None = None) -> str:
    error: dict[str, Any] = {"code": code, "message": message}
    if line is not None:
        error["line"] = line
    return _dump({"id": request_line_id(), "custom_id": custom_id, "response": None, "error": error})
