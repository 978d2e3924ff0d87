"""An upstream's error answers as the client's errors, and answers that are not what was
expected quoted for a message (bounded, HTML-escaped)."""

from __future__ import annotations

import html
import json

from laneway.backends.http import MAX_ERROR_BYTES, Events
from laneway.backends.upstream_run import EngineError, UpstreamUnavailable, message_of
from laneway.errors import InvalidRequest, ModelNotFound, NotFound, PassedOn, PayloadTooLarge, RequestError

MAX_ERROR_CHARS = 300


def error_from(status: int, raw: bytes, name: str, content_type: bytes = b"", path: str = "") -> Exception:
    """The client-facing error for an upstream's error answer to ``POST /path``. A 404 is the
    model's (``model_not_found``) where the upstream says so, else the endpoint's: the
    upstream has no such route (``not_found``)."""
    err = _error_object(raw)
    if err is not None:
        message = message_of(err)[:MAX_ERROR_CHARS]
    else:
        message = f"HTTP {status}, " + describe_body(raw, content_type)
    text = f"upstream {name}: {message}"
    # (the field the upstream names: the client's, which it was sent as asked)
    param = err.get("param") if isinstance(err, dict) and isinstance(err.get("param"), str) else None
    if status == 404:
        about_model = param == "model" or "model" in message.lower()
        if about_model or not path:
            return ModelNotFound(text, param=param)
        return NotFound(f"upstream {name} does not serve POST /{path} (HTTP 404: {message})")
    if status == 413:
        return PayloadTooLarge(text, param=param)
    if 400 <= status < 500 and status not in (401, 403, 408, 429):
        invalid = InvalidRequest(text, param=param)
        invalid.code = _code(err)  # (OpenAI's codes are words: context_length_exceeded, ...)
        return invalid
    # busy (429), or unreachable behind a proxy (502-504): the worker's, tried elsewhere; else
    # (a 500) the request's own: it fails, as the engine would fail it again
    fault = status in (429, 502, 503, 504, 529) or status < 400  # (529: Anthropic's "overloaded")
    return UpstreamUnavailable(
        f"{text} (HTTP {status})", worker_fault=fault, malformed=False, retryable=fault
    )


def engine_error(exc: EngineError, name: str) -> Exception:
    """What an error the upstream sent inside its stream is to the client: where it gives
    a client error's status (vLLM: ``"code": 400``; or says ``invalid_request_error``),
    that error, as the same answer outside a stream would be; else the generation failed
    (``exc`` itself, a 502)."""
    err = exc.error
    code = err.get("code") if isinstance(err, dict) else None
    kind = err.get("type") if isinstance(err, dict) else None
    status = code if isinstance(code, int) and not isinstance(code, bool) else None
    if status is None and kind in ("invalid_request_error", "BadRequestError"):
        status = 400
    if status is None or not 400 <= status < 500 or status in (401, 403, 408, 429):
        return exc
    return error_from(status, json.dumps({"error": err}).encode(), name)


def _code(err: object) -> str | None:
    """The error's ``code`` where it is a word (vLLM's older answers give the HTTP status
    there, a number: none)."""
    code = err.get("code") if isinstance(err, dict) else None
    if isinstance(code, str) and 0 < len(code) <= 64 and code.replace("_", "").replace(".", "").isalnum():
        return code
    return None


def _error_object(raw: bytes) -> object | None:
    """The error an upstream's JSON answer holds: OpenAI's ``{"error": ...}``, an object
    that is itself the error (``{"object": "error", "message": ...}``, older vLLM), or a web
    framework's ``{"detail": ...}``; ``None`` for anything else."""
    try:
        answer = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(answer, dict):
        return None
    if "error" in answer:
        return answer["error"]
    if isinstance(answer.get("message"), str):
        return answer
    detail = answer.get("detail")
    return detail if isinstance(detail, str) and detail else None


def relay_error(status: int, raw: bytes, name: str, endpoint: str, content_type: bytes) -> Exception:
    """A relayed request's error: as any upstream error, but a 404 is the endpoint's (the
    model was found: the upstream serves it), and so is a 405 (a path it serves with other
    methods: vLLM's ``/v1/responses/{id}`` takes ``/v1/responses/input_tokens``)."""
    if status in (404, 405):
        return NotFound(
            f"upstream {name} does not serve POST /{endpoint} (HTTP {status}): "
            + describe_body(raw, content_type)
        )
    err = error_from(status, raw, name, content_type)
    if isinstance(err, RequestError) and len(raw) < MAX_ERROR_BYTES:  # (the client's: as it came)
        return PassedOn(err.message, status, raw, content_type.decode("latin-1"))
    return err


def stream_failure(
    reader: Events, name: str, endpoint: str | None = None, path: str = ""
) -> Exception | None:
    """What an answer that should have been an event stream fails with: its error
    (``endpoint``: of a relayed request; ``path``: where it was sent), or a 200 that is not a
    stream (a proxy's page, an engine that ignored ``stream``); ``None`` for a stream."""
    if reader.status != 200:
        if endpoint is not None:
            return relay_error(reader.status, reader.error_body, name, endpoint, reader.content_type)
        return error_from(reader.status, reader.error_body, name, reader.content_type, path)
    if not reader.is_stream:
        return UpstreamUnavailable(
            f"upstream {name} answered 200 but not with an event stream: "
            + describe_body(reader.error_body, reader.content_type)
        )
    return None


def describe_body(raw: bytes, content_type: bytes = b"") -> str:
    """An answer that is not what was expected, quoted for an error message: its type and
    size, and its start with white space collapsed, bounded and HTML-escaped (a proxy's
    error page carries markup and scripts that a client may display)."""
    kind = content_type.decode("latin-1").split(";")[0].strip() or "no content type"
    start = " ".join(raw[: MAX_ERROR_CHARS * 4].decode("utf-8", "replace").split())
    if len(start) > MAX_ERROR_CHARS:
        start = start[:MAX_ERROR_CHARS] + "…"
    quoted = html.escape(start, quote=False) if start else "an empty body"  # (text, not an attribute)
    return f"{kind}, {len(raw)} bytes{'+' if len(raw) >= MAX_ERROR_BYTES else ''}: {quoted}"
