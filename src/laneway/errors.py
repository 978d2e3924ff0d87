"""Errors a client can cause, each with its HTTP status and OpenAI error code.

They extend the core's :class:`~laneway.core.errors.LanewayError` tree. The
engine, the backends and the HTTP layer raise these; the API turns them into
OpenAI's error shape (``{"error": {"message", "type", "code", "param"}}``).
"""

from __future__ import annotations

import math

from laneway.core.errors import LanewayError


class RequestError(LanewayError):
    """A request cannot be served as asked. ``status`` is the HTTP status."""

    status = 400
    type = "invalid_request_error"
    code: str | None = None
    # whether a client should send it again as it is (``x-should-retry``, which OpenAI's own
    # clients obey over their default of retrying 5xx); None: the default
    should_retry: bool | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(RequestError):
    """A parameter is missing, malformed or out of range (400)."""


class ContextTooLong(RequestError):
    """The prompt does not fit the model's context window (400)."""

    code = "context_length_exceeded"


class ModelNotFound(RequestError):
    """No worker serves the named model, or a model spec names nothing loadable (404)."""

    status = 404
    code = "model_not_found"


class ModelLoadError(LanewayError):
    """A model directory exists but could not be loaded; the message says why."""


class DeviceUnavailable(ModelLoadError):
    """The device a model was to be loaded on is not one, or not on this machine."""


class BackendError(LanewayError):
    """A worker failed while running a request (the engine broke, an upstream erred)."""

    retryable = False


class Unauthorized(RequestError):
    """No API key, or one no tenant holds (401)."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class ClassNotAllowed(RequestError):
    """The tenant may not use the priority class it asked for (403)."""

    status = 403
    type = "permission_error"
    code = "class_not_allowed"


class PayloadTooLarge(RequestError):
    """The request body is larger than the server accepts (413)."""

    status = 413
    code = "payload_too_large"


class UnsupportedEncoding(RequestError):
    """A request body sent compressed (``Content-Encoding``), which laneway does not read (415)."""

    status = 415
    code = "unsupported_content_encoding"


RETRY_MIN_S = 1.0  # Retry-After is at least this
RETRY_MAX_S = 3600.0  # ... and at most this
RETRY_UNKNOWN_S = 10.0  # ... and this where neither a retry time nor the wait is known


def retry_figures(wait_s: float | None, retry_s: float | None = None) -> tuple[float, float | None]:
    """The one rule for what a refusal that may be tried again (429, 503) tells:
    ``(retry_after_s, estimated_wait_s)``.

    - ``estimated_wait_s``: what a request of its class would wait now, to the
      millisecond; ``None`` (``null``) where that is not known (``wait_s`` infinite or
      ``None``: no worker is up, the scheduler or the store cannot be reached).
    - ``retry_after_s``: the refusal's own time to come back where it has one (``retry_s``:
      a quota's refill, the next health probe), else the wait; never under
      :data:`RETRY_MIN_S` nor over :data:`RETRY_MAX_S`; :data:`RETRY_UNKNOWN_S` where
      neither is known. (``Retry-After`` is it rounded up to whole seconds.)
    """
    wait = round(wait_s, 3) if wait_s is not None and math.isfinite(wait_s) else None
    if retry_s is not None and math.isfinite(retry_s) and retry_s > 0:
        retry = retry_s
    elif wait is not None:
        retry = wait
    else:
        retry = RETRY_UNKNOWN_S
    return round(float(min(max(retry, RETRY_MIN_S), RETRY_MAX_S)), 3), wait


class Deferred(RequestError):
    """Not now: try again after ``retry_after_s`` (429 and 503 answers carry ``Retry-After``).

    ``estimated_wait_s`` is what a request of the same class would wait now (``None``: not
    known); both come from the one rule, :func:`retry_figures`.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str,
        retry_after_s: float | None = None,
        estimated_wait_s: float | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message, param=param)
        self.code = code
        self.retry_after_s, self.estimated_wait_s = retry_figures(estimated_wait_s, retry_after_s)


class QuotaExceeded(Deferred):
    """The tenant is over a rate quota or a concurrency cap (429)."""

    status = 429
    type = "rate_limit_error"


class Unavailable(Deferred):
    """Queued past the class timeout, queue full or overloaded (503)."""

    status = 503
    type = "server_error"


class GenerationFailed(RequestError):
    """A worker failed while generating; the request did not complete (502)."""

    status = 502
    type = "server_error"
    code = "generation_failed"


class ClientGone(GenerationFailed):
    """The client went away (a stream closed, a connection dropped): the request was
    cancelled. No error of the server's (its trace span is not marked as one)."""


class UpstreamTimeout(RequestError):
    """One run of the request took longer than its worker's ``timeout_s``: it ends here, not
    on another worker (where it would take as long), and the worker stays in placement (504)."""

    status = 504
    type = "server_error"
    code = "upstream_timeout"
    should_retry = False  # (it would take as long again)


class PassedOn(RequestError):
    """An upstream's own answer to a request passed through to it (Anthropic's Messages API
    …) that refused it: the client gets it as the upstream wrote it (``status``, ``body``,
    ``content_type``), in that API's own shape, not OpenAI's."""

    def __init__(self, message: str, status: int, body: bytes, content_type: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.content_type = content_type


class NotFound(RequestError):
    """No such file or batch — or one that belongs to another tenant (404)."""

    status = 404
    code = "not_found"


class Conflict(RequestError):
    """The object is in a state that does not allow this (e.g. cancelling a finished batch) (409)."""

    status = 409
    code = "conflict"


class Gone(RequestError):
    """A batch or file that existed but was lost (the shared store lost its data) (410)."""

    status = 410
    code = "lost"
