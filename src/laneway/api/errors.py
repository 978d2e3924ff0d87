"""Every error in OpenAI's shape: ``{"error": {"message", "type", "code", "param"}}``.

429 and 503 answers carry ``Retry-After`` (whole seconds) and, in the error
object, ``estimated_wait_s``. An error a client should not send again as it is (a run
past its worker's ``timeout_s``) carries ``x-should-retry: false``, which OpenAI's
clients obey.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from laneway.errors import Deferred, PassedOn, RequestError, Unavailable

log = logging.getLogger("laneway.api")

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


def error_json(
    status: int, message: str, type_: str, code: str | None, param: str | None = None, **extra: Any
) -> JSONResponse:
    body: dict[str, Any] = {"message": message, "type": type_, "code": code, "param": param, **extra}
    return JSONResponse({"error": body}, status_code=status)


def request_error(exc: RequestError) -> Response:
    if isinstance(exc, PassedOn):  # (an upstream's own refusal of a request passed through)
        return Response(exc.body, exc.status, media_type=exc.content_type or None)
    extra: dict[str, Any] = {}
    if isinstance(exc, Deferred):
        extra["estimated_wait_s"] = exc.estimated_wait_s
        extra["retry_after_s"] = exc.retry_after_s
    resp = error_json(exc.status, exc.message, exc.type, exc.code, exc.param, **extra)
    if isinstance(exc, Deferred):
        resp.headers["Retry-After"] = str(math.ceil(exc.retry_after_s))
    if exc.should_retry is not None:
        resp.headers["x-should-retry"] = "true" if exc.should_retry else "false"
    return resp


async def on_request_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    return request_error(exc)


async def on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    status = exc.status_code
    if status == 404:
        message = f"no such route: {request.method} {request.url.path}"
    elif status == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    else:
        message = exc.detail
    resp = error_json(status, message, "invalid_request_error", _HTTP_CODES.get(status))
    for name, value in (exc.headers or {}).items():
        resp.headers[name] = value
    return resp


STORE_RETRY_S = 2


async def on_store_unavailable(request: Request, exc: Exception) -> Response:
    """The shared store cannot be reached now: 503, try again shortly (a write whose answer
    was lost on the way may have been made)."""
    log.warning("%s %s: %s", request.method, request.url.path, exc)
    return request_error(
        Unavailable(f"{exc}; try again shortly", code="store_unavailable", retry_after_s=STORE_RETRY_S)
    )
