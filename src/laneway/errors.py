"""Errors a client can cause, each with its HTTP status and OpenAI error code.

They extend the core's :class:`~laneway.core.errors.LanewayError` tree. The
engine, the backends and the HTTP layer raise these; the API turns them into
OpenAI's error shape (``{"error": {"message", "type", "code", "param"}}``).
"""

from __future__ import annotations

from laneway.core.errors import LanewayError


class RequestError(LanewayError):
    """A request cannot be served as asked. ``status`` is the HTTP status."""

    status = 400
    type = "invalid_request_error"
    code: str | None = None

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


class BackendError(LanewayError):
    """A worker failed while running a request (the engine broke, an upstream erred)."""

    retryable = False
