"""A small HTTP/1.1 client for talking to upstream engines, on asyncio protocols and httptools.

The upstream path is laneway's hot path: a 1-token request crosses it twice
(request out, answer back) and every streamed token once. Measured on this
project's 2-core machine, a kept-alive POST of a small JSON body and its
JSON answer cost the client ~660 µs of CPU with httpx, ~200 µs with aiohttp
and ~85 µs on a bare protocol with httptools' parser (the one uvicorn uses).
So the upstream worker speaks HTTP through this module:

- a :class:`Pool` of kept-alive connections per upstream (plain TCP or TLS);
- :meth:`Pool.request` sends one request; the answer's body is handed to a
  :class:`Reader` piece by piece as it arrives, synchronously, inside the
  protocol callback (no task switch per streamed chunk);
- :meth:`Exchange.abort` drops the connection at once (an upstream aborts
  the sequence when its client goes away), without waiting for a teardown;
- a stall timeout fails an exchange that received no byte for too long;
- a connection idle for :data:`KEEP_IDLE_S` is not used again; one the upstream
  closes as a request goes out on it fails with :class:`Stale` (a race with its
  idle timeout, not an upstream gone), one lost in the middle of an answer with
  :class:`Cut` (the upstream was there and broke off that answer).

Only what upstream engines need is here: one request at a time per
connection, ``Content-Length`` bodies out, ``Content-Length`` or chunked
answers in (httptools decodes the chunking).

How a connection is made is a seam (:data:`Connect`): by default a TCP (or TLS) connection
to the upstream; :class:`~laneway.backends.inprocess.InProcess` makes one to an ASGI app
in this process instead (the stand-in engine, in tests).
"""

from __future__ import annotations

import asyncio
import math
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

from laneway.backends.http_readers import (
    MAX_BODY_BYTES,
    MAX_ERROR_BYTES,
    MAX_EVENT_BYTES,
    Aborted,
    Collect,
    Cut,
    Enough,
    Events,
    HttpError,
    Reader,
    Stale,
    Timeout,
    TooLarge,
    Unreached,
)

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_ERROR_BYTES",
    "MAX_EVENT_BYTES",
    "Aborted",
    "Collect",
    "Connect",
    "Cut",
    "Enough",
    "Events",
    "Exchange",
    "HttpError",
    "Pool",
    "Reader",
    "Stale",
    "Target",
    "Timeout",
    "TooLarge",
    "Unreached",
]


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str  # the base path, without a trailing slash ("/v1")

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"an upstream URL has no query or fragment: {url!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ValueError(f"bad port in {url!r}") from None
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> bytes:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (host if self.port == default else f"{host}:{self.port}").encode("idna")


# a connection idle this long is not used again: servers close theirs after a few seconds
# (uvicorn's default, vLLM's and SGLang's: 5 s), and one closed as a request goes out on it
# fails that request
KEEP_IDLE_S = 4.0


class Exchange:
    """One request and its answer on a connection."""

    __slots__ = ("_conn", "done", "reader")

    def __init__(self, conn: _Connection, reader: Reader) -> None:
        self._conn: _Connection | None = conn
        self.reader = reader
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def abort(self) -> None:
        """Drop the connection now; :attr:`done` fails with :class:`Aborted`."""
        self.fail(Aborted("aborted"))

    def fail(self, error: Exception) -> None:
        """Drop the connection now; :attr:`done` fails with ``error``."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.fail(error)

    def _finish(self, error: Exception | None) -> None:
        self._conn = None
        if not self.done.done():
            if error is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(error)
                self.done.exception()  # retrieved: an abort nobody awaits is not an error to log


class _Connection(asyncio.Protocol):
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: Exchange | None = None
        self.closed = False
        self._headers: dict[bytes, bytes] = {}
        self._last = 0.0  # loop time of the last byte received
        self._timer: asyncio.TimerHandle | None = None
        self._stall = math.inf
        self._stop: Exception | None = None  # what a reader raised (httptools reports its own error)
        self.uses = 0  # exchanges sent on it
        self.idle_since = 0.0  # loop time it was put back in the pool
        self._answered = False  # the current exchange's status and headers came
        self._heard = False  # a byte of the current exchange's answer came

    # -------------------------------------------------------------- asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._forget(self)
        if self.exchange is not None:
            why = f"connection lost: {exc or 'closed by the upstream'}"
            if self._answered:
                self.fail(Cut(f"{why} (in the middle of its answer)"))
            elif self.uses > 1 and not self._heard:  # (a kept-alive one, closed as the request went)
                self.fail(Stale(why))
            else:
                self.fail(HttpError(why))

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        self._heard = True
        if exchange is None or exchange.reader.bytes_are_progress:
            self._last = self.pool.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.fail(HttpError("the upstream asked for a protocol upgrade"))
        except httptools.HttpParserError as exc:
            # (httptools reports what a callback raised as its own error; the reader's is kept)
            stop, self._stop = self._stop, None
            if isinstance(stop, Enough):  # the reader has what it wants: the rest is not read
                exchange, self.exchange = self.exchange, None
                self.close()
                if exchange is not None:
                    exchange._finish(None)
            elif stop is not None:  # a reader that refused the answer: the exchange fails with it
                self.fail(stop)
            else:
                self.fail(HttpError(f"malformed HTTP answer: {exc}"))

    # -------------------------------------------------------------- httptools
    def on_message_begin(self) -> None:
        self._headers = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        self._answered = True
        if self.exchange is not None:
            try:
                self.exchange.reader.head(self.parser.get_status_code(), self._headers)
            except Exception as exc:
                self._stop = exc
                raise

    def on_body(self, body: bytes) -> None:
        if self.exchange is not None:
            try:
                self.exchange.reader.data(body)
            except Exception as exc:
                self._stop = exc
                raise

    def on_message_complete(self) -> None:
        exchange, self.exchange = self.exchange, None
        self._cancel_timer()
        keep = self.parser.should_keep_alive()
        if exchange is not None:
            exchange._finish(None)
        else:  # an answer nobody asked for (the connection was idle, in the pool): not trusted again
            keep = False
        if keep and not self.closed:
            self.pool._release(self)
        else:
            self.close()

    # -------------------------------------------------------------- ours
    def touch(self) -> None:
        """Progress on the exchange: its stall timer starts again."""
        self._last = self.pool.loop.time()

    def send(self, raw: bytes, reader: Reader, stall_s: float) -> Exchange:
        exchange = Exchange(self, reader)
        self.exchange = exchange
        self.uses += 1
        self._answered = self._heard = False
        reader.progress = self.touch
        self._last = self.pool.loop.time()
        self._stall = stall_s
        if math.isfinite(stall_s):
            self._timer = self.pool.loop.call_later(stall_s, self._check_stall)
        assert self.transport is not None
        self.transport.write(raw)
        return exchange

    def _check_stall(self) -> None:
        self._timer = None
        if self.exchange is None:
            return
        idle = self.pool.loop.time() - self._last
        if idle >= self._stall:
            what = "nothing" if self.exchange.reader.bytes_are_progress else "no event"
            self.fail(Timeout(f"the upstream sent {what} for {self._stall:g} s"))
        else:
            self._timer = self.pool.loop.call_later(self._stall - idle, self._check_stall)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def fail(self, error: Exception) -> None:
        exchange, self.exchange = self.exchange, None
        self.close()
        if exchange is not None:
            exchange._finish(error)

    def close(self) -> None:
        self._cancel_timer()
        if not self.closed:
            self.closed = True
            self.pool._forget(self)
            if self.transport is not None:
                self.transport.abort()


# how a connection is made: given the protocol factory, the transport and the protocol made
Connect = Callable[
    [Callable[[], asyncio.Protocol]], Awaitable[tuple[asyncio.BaseTransport, asyncio.Protocol]]
]


class Pool:
    """Kept-alive connections to one upstream (``base_url`` such as ``http://host:port/v1``);
    ``connect``: how a connection is made (by default, to the host and port of ``base_url``)."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str] | None = None,
        connect_timeout_s: float = 10.0,
        max_idle: int = 16,
        connect: Connect | None = None,
    ) -> None:
        self.target = Target.parse(base_url)
        self._connect_with = connect
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle
        extra = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in (headers or {}).items())
        self._head_tail = b"Host: " + self.target.host_header + b"\r\n" + extra
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._ssl: ssl.SSLContext | None = (
            ssl.create_default_context() if self.target.scheme == "https" else None
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def path(self, rel: str) -> bytes:
        """The request path for ``rel`` under the base path (``rel`` starting with ``/``
        is taken from the server's root)."""
        return (rel if rel.startswith("/") else f"{self.target.path}/{rel}").encode("latin-1")

    async def _connect(self) -> _Connection:
        t = self.target
        made: list[_Connection] = []

        def protocol() -> _Connection:
            made.append(_Connection(self))
            return made[-1]

        # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the connection when a
        # cancel arrives just as it is made (the cancel is lost, and the request that follows
        # is sent for a caller that was told it ended)
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                if self._connect_with is not None:
                    await self._connect_with(protocol)
                    conn = made[-1]  # (the protocol it made)
                else:
                    _, conn = await self.loop.create_connection(
                        protocol, t.host, t.port, ssl=self._ssl, server_hostname=t.host if self._ssl else None
                    )
        except TimeoutError:
            raise Unreached(
                f"could not connect to {t.host}:{t.port} within {self.connect_timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise Unreached(f"could not connect to {t.host}:{t.port}: {exc.strerror or exc}") from None
        except asyncio.CancelledError:
            for c in made:  # made just before the cancel: nobody will use it
                c.close()
            raise
        self._open.add(conn)
        return conn

    async def request(
        self,
        method: str,
        rel: str,
        body: bytes | None,
        reader: Reader,
        *,
        stall_s: float = math.inf,
        accept: bytes = b"application/json",
        traceparent: str | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> Exchange:
        """Send a request; its answer goes to ``reader``. Await ``exchange.done`` for its end.
        ``traceparent``: the W3C trace context it carries (a header); ``headers``: more (names
        and values checked by the caller: no line breaks)."""
        if self.closed:
            raise HttpError("the connection pool is closed")
        conn = None
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed and self.loop.time() - conn.idle_since < KEEP_IDLE_S:
                break
            conn.close()  # (idle for long: the upstream may be closing it just now)
            conn = None
        if conn is None:
            conn = await self._connect()
        head = b"%s %s HTTP/1.1\r\n%sAccept: %s\r\n" % (
            method.encode(),
            self.path(rel),
            self._head_tail,
            accept,
        )
        if traceparent is not None and traceparent.isascii() and traceparent.isprintable():
            head += b"traceparent: " + traceparent.encode() + b"\r\n"
        for name, value in headers:
            head += b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1"))
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            return conn.send(head + body, reader, stall_s)
        return conn.send(head + b"\r\n", reader, stall_s)

    async def fetch(
        self,
        method: str,
        rel: str,
        body: bytes | None = None,
        *,
        timeout_s: float,
        max_bytes: int = MAX_BODY_BYTES,
        traceparent: str | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> Collect:
        """A whole exchange, its answer kept (up to ``max_bytes``); :class:`HttpError` past
        ``timeout_s``. A caller cancelled meanwhile aborts the exchange (the upstream sees
        its client leave)."""
        reader = Collect(max_bytes)
        exchange = await self.request(method, rel, body, reader, traceparent=traceparent, headers=headers)
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(exchange.done)
        except TimeoutError:
            exchange.abort()
            raise Timeout(f"no answer within {timeout_s:g} s") from None
        except asyncio.CancelledError:
            exchange.abort()
            raise
        return reader

    def _release(self, conn: _Connection) -> None:
        if self.closed or len(self._idle) >= self.max_idle:
            conn.close()
        else:
            conn.idle_since = self.loop.time()
            self._idle.append(conn)

    def _forget(self, conn: _Connection) -> None:
        self._open.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)

    async def close(self) -> None:
        self.closed = True
        for conn in list(self._open):
            conn.fail(Aborted("the pool was closed"))
        self._idle.clear()
