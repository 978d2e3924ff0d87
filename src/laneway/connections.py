"""Connections that cannot lock clients out: time limits and a cap.

uvicorn's HTTP protocol (httptools) with three additions:

- a request's head must arrive within ``header_timeout_s`` of the connection
  opening or of its first byte (a client that connects and sends nothing, or
  sends its headers a byte at a time, is closed); its body within
  ``body_timeout_s`` of the head. A late request gets 408 and the connection
  closes; keep-alive connections idle ``keep_alive_s`` close (uvicorn's own).
- a request's head (request line and headers) is at most ``max_header_bytes``,
  and so are a chunked body's trailers (which are read and dropped: the app
  never sees them); past it the client gets 431 and the connection closes, so
  a client sending megabytes of headers costs the event loop one read, not
  seconds of parsing. A malformed request gets 400 in OpenAI's error shape (not
  plain text).
- at most ``max_connections`` open at once. A new connection past the cap
  closes the longest-idle keep-alive connection to make room; when none is
  idle, the newcomer gets 503 with ``Retry-After`` and is closed.
- :func:`raise_fd_limit` lifts the soft file-descriptor limit to the hard one
  at start-up; the cap defaults to what that limit leaves (see :func:`cap_for`).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from laneway.errors import retry_figures

DEFAULT_MAX_HEADER_BYTES = 64 << 10  # a request's line and headers (cookies and tokens fit)
FD_RESERVE_MIN = 64  # descriptors kept for everything but client connections (files, upstreams)


def raise_fd_limit() -> int:
    """Lift the soft limit on open files to the hard one where allowed; the soft limit after."""
    try:
        import resource
    except ImportError:  # (not on this platform)
        return 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 16


def cap_for(fd_limit: int) -> int:
    """Client connections to allow under ``fd_limit`` descriptors: an eighth (at least 64) is
    kept for the store, model files, logs and upstream connections."""
    return max(16, fd_limit - max(FD_RESERVE_MIN, fd_limit // 8))


_REFUSED_RETRY_S, _REFUSED_WAIT_S = retry_figures(None, 1.0)  # (a connection is let go soon)
_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: "
    + str(math.ceil(_REFUSED_RETRY_S)).encode()
    + b"\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
)
_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)
_MALFORMED = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)
_LATE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)


def _raw(template: bytes, message: str, type_: str, code: str, **extra: object) -> bytes:
    error = {"message": message, "type": type_, "code": code, "param": None, **extra}
    body = json.dumps({"error": error}, separators=(",", ":")).encode()
    return template % (len(body), body)


REFUSED = _raw(
    _REFUSED,
    "too many open connections; try again",
    "server_error",
    "too_many_connections",
    estimated_wait_s=_REFUSED_WAIT_S,
    retry_after_s=_REFUSED_RETRY_S,
)
LATE = _raw(_LATE, "the request did not arrive in time", "invalid_request_error", "request_timeout")
MALFORMED = _raw(_MALFORMED, "malformed HTTP request", "invalid_request_error", "invalid_http")


class HeadTooLarge(Exception):
    """Raised in a parser callback to stop parsing a head past the limit."""


class Limits:
    """The limits, shared by every connection of one server."""

    def __init__(
        self,
        header_timeout_s: float,
        body_timeout_s: float,
        max_connections: int,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
    ) -> None:
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.max_connections = max_connections
        self.max_header_bytes = max_header_bytes
        self.too_large = _raw(
            _TOO_LARGE,
            f"the request's headers are over {max_header_bytes} bytes",
            "invalid_request_error",
            "headers_too_large",
        )
        self.refused = 0  # connections answered 503 at the cap
        self.evicted = 0  # idle connections closed to make room
        self.timed_out = 0  # requests that did not arrive in time
        self.oversized = 0  # requests whose head was past max_header_bytes


def protocol_with(limits: Limits) -> type[asyncio.Protocol]:
    """The HTTP protocol class for uvicorn's ``http=`` with ``limits``."""

    class Guarded(GuardedProtocol):
        pass

    Guarded.limits = limits
    return Guarded


class GuardedProtocol(HttpToolsProtocol):
    limits: Limits

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._deadline: asyncio.TimerHandle | None = None
        self._reading = False  # a request's head or body is arriving
        self._idle_since = time.monotonic()
        self._in_head = True  # what arrives is a request's head (or nothing yet)
        self._head_bytes = 0  # of the head arriving, received so far
        self._completed = False  # a request ended in the bytes being fed
        self._head_len = 0  # the URL's and headers' bytes of this request, as parsed
        self._oversized = False  # its head (or trailers) went past the limit

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        self._completed = False
        super().data_received(data)  # (at most one read's worth parsed past the limit)
        if not self._in_head or self.transport.is_closing():
            return
        # a request that ended in these bytes leaves the next head counted from 0 (an
        # undercount of one read at most; never an overcount of a request with a body)
        self._head_bytes = 0 if self._completed else self._head_bytes + len(data)
        if self._head_bytes > self.limits.max_header_bytes:
            self._too_large()

    def _too_large(self) -> None:
        self.limits.oversized += 1
        self._disarm()
        self.transport.write(self.limits.too_large)
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """A request httptools cannot parse: 400 in OpenAI's error shape, and close; or
        431 where a callback stopped the parse at a head past the limit."""
        if self._oversized:
            self._too_large()
            return
        self.logger.debug("malformed request: %s", msg)
        self._disarm()
        self.transport.write(MALFORMED)
        self.transport.close()

    # what the parser found, counted: a head that arrived in one read is measured too
    def _count(self, n: int) -> None:
        self._head_len += n
        if self._head_len > self.limits.max_header_bytes:
            self._oversized = True
            raise HeadTooLarge  # (stops the parse: send_400_response answers 431)

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)  # (": " and CRLF)
        if self._in_head:
            super().on_header(name, value)
        # else a chunked body's trailer: counted, and dropped (it is not the request's head)

    # a request's head, then its body, on a clock
    def _arm(self, seconds: float) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(seconds, self._late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _late(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        self.limits.timed_out += 1
        # a head or body late (a connection that never began a request: closed, silently)
        if self._reading and (self._in_head or not self._app_started()):
            self.transport.write(LATE)
        self.transport.close()

    def _app_started(self) -> bool:
        return self.cycle is not None and getattr(self.cycle, "response_started", False)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = self.limits
        if len(self.connections) > limits.max_connections and not self._make_room():
            limits.refused += 1
            transport.write(REFUSED)
            transport.close()
            return
        self._arm(limits.header_timeout_s)  # the first request's head, from now

    def _make_room(self) -> bool:
        """Close the longest-idle keep-alive connection; ``False`` if none is idle."""
        idle = [
            c
            for c in self.connections
            if c is not self and isinstance(c, GuardedProtocol) and c._idle() and not c.transport.is_closing()
        ]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c._idle_since)
        oldest.transport.close()
        self.connections.discard(oldest)
        self.limits.evicted += 1
        return True

    def _idle(self) -> bool:
        return not self._reading and (self.cycle is None or self.cycle.response_complete)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        self._head_len = 0
        super().on_message_begin()
        self._reading = True
        if self._deadline is None:
            self._arm(self.limits.header_timeout_s)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        super().on_headers_complete()
        self._arm(self.limits.body_timeout_s)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True
        self._completed = True
        self._reading = False
        self._disarm()

    def on_response_complete(self) -> None:
        self._idle_since = time.monotonic()
        super().on_response_complete()


def uvicorn_options(
    header_timeout_s: float,
    body_timeout_s: float,
    keep_alive_s: float,
    max_connections: int | None,
    fd_limit: int,
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
) -> dict[str, Any]:
    """The ``uvicorn.Config`` keywords that put these limits on a server."""
    cap = max_connections if max_connections is not None else cap_for(fd_limit)
    limits = Limits(header_timeout_s, body_timeout_s, cap, max_header_bytes)
    return {"http": protocol_with(limits), "timeout_keep_alive": keep_alive_s, "backlog": 2048}
