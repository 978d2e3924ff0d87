"""What an upstream's answer is read into, and how an exchange with it fails.

A :class:`Reader` is handed an answer's status, headers and body pieces as they arrive
(inside the connection's protocol callback: :mod:`laneway.backends.http`):
:class:`Events` splits a server-sent event stream into events, :class:`Collect` keeps a
whole body; both bounded (:class:`TooLarge` past their limits).
"""

from __future__ import annotations

from collections.abc import Callable

from laneway.errors import BackendError


class HttpError(BackendError):
    """The exchange failed: connection refused or lost, a timeout, a malformed answer."""

    retryable = True


class Timeout(HttpError):
    """Nothing (or not all) came back in time: the upstream may be slow, not gone."""


class Unreached(HttpError):
    """No connection could be made (refused, reset, timed out): the request was not sent."""


class Cut(HttpError):
    """The connection was lost after the answer began (its status and headers came): the
    upstream was there, and broke off this answer."""


class Stale(HttpError):
    """A kept-alive connection was closed by the upstream as a request went out on it
    (nothing came back): a race with the upstream's idle timeout, not an upstream gone."""


class Aborted(HttpError):
    """The exchange was aborted on purpose (a preemption or a cancel)."""


class TooLarge(HttpError):
    """The answer (or one event of it) is larger than the reader keeps."""


class Enough(Exception):
    """Raised by a reader that has all it wants of an answer: the exchange ends now (done,
    not failed) and the connection is closed rather than read to its end."""


MAX_EVENT_BYTES = 16 << 20  # one server-sent event (a chunk of a streamed answer)
MAX_ERROR_BYTES = 64 << 10  # of an error answer's body (only its start is quoted)
MAX_BODY_BYTES = 256 << 20  # a whole answer kept by :class:`Collect` (an embedding of many inputs)


class Reader:
    """What an exchange's answer is handed to (override what you need).

    ``bytes_are_progress``: whether any byte received counts as progress for the
    exchange's stall timeout; a reader that says ``False`` calls :attr:`progress` itself
    when it has received something that counts (an event of a stream), so that an
    upstream trickling bytes without a token still stalls.
    """

    bytes_are_progress = True

    def __init__(self) -> None:
        self.progress: Callable[[], None] = _nothing

    def head(self, status: int, headers: dict[bytes, bytes]) -> None:
        """The status line and headers (names lower-cased)."""

    def data(self, piece: bytes) -> None:
        """A piece of the (de-chunked) body, as it arrives."""


def _nothing() -> None:
    pass


class Events(Reader):
    """A ``text/event-stream`` answer: each event's ``data`` goes to ``on_event``.

    An answer that is not a 200 is kept instead (its first :data:`MAX_ERROR_BYTES`:
    :attr:`error_body`), for the caller to turn into an error; so is a 200 that is not
    an event stream (:attr:`content_type` says what it was). Each byte is scanned once,
    and an event longer than ``max_event_bytes`` fails the exchange (:class:`TooLarge`).
    Only an event counts as progress for the stall timeout.
    """

    bytes_are_progress = False

    def __init__(self, on_event: Callable[[bytes], None], *, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        super().__init__()
        self.on_event = on_event
        self.max_event_bytes = max_event_bytes
        self.status = 0
        self.content_type = b""
        self.events = 0
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf already searched for an event's end
        self._cr = False  # the last piece ended in "\r" (held back: "\r\n" may be split)
        self._error: bytearray | None = None

    def head(self, status: int, headers: dict[bytes, bytes]) -> None:
        self.status = status
        self.content_type = headers.get(b"content-type", b"")
        if status != 200 or not self.content_type.lower().startswith(b"text/event-stream"):
            self._error = bytearray()
        self.progress()  # (the head counts: the engine took the request)

    @property
    def is_stream(self) -> bool:
        return self._error is None

    @property
    def error_body(self) -> bytes:
        return bytes(self._error or b"")

    def data(self, piece: bytes) -> None:
        if self._error is not None:
            room = MAX_ERROR_BYTES - len(self._error)
            self._error += piece[:room]
            if len(piece) >= room:
                raise Enough
            return
        if self._cr:
            piece = b"\r" + piece
            self._cr = False
        if piece.endswith(b"\r"):
            piece = piece[:-1]
            self._cr = True
        if b"\r" in piece:
            piece = piece.replace(b"\r\n", b"\n")
        buf = self._buf
        buf += piece
        start = 0
        while True:
            end = buf.find(b"\n\n", max(start, self._scanned - 1))
            if end < 0:
                break
            self._event(bytes(buf[start:end]))
            start = end + 2
            self._scanned = start
        if start:
            del buf[:start]
        self._scanned = len(buf)
        if len(buf) > self.max_event_bytes:
            raise TooLarge(f"an event of the stream is over {self.max_event_bytes >> 20} MiB")

    def _event(self, block: bytes) -> None:
        if block.startswith(b"data:") and b"\n" not in block:  # the usual event: one data line
            self.events += 1
            self.progress()
            self.on_event(block[5:].lstrip(b" "))
            return
        lines = [ln[5:].lstrip(b" ") for ln in block.split(b"\n") if ln.startswith(b"data:")]
        if lines:
            self.events += 1
            self.progress()
            self.on_event(b"\n".join(lines))


class Collect(Reader):
    """Keeps the whole body (up to ``max_bytes``: past it the exchange fails, :class:`TooLarge`)."""

    def __init__(self, max_bytes: int = MAX_BODY_BYTES) -> None:
        super().__init__()
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.parts: list[bytes] = []
        self.size = 0
        self.max_bytes = max_bytes

    def head(self, status: int, headers: dict[bytes, bytes]) -> None:
        self.status, self.headers = status, headers

    def data(self, piece: bytes) -> None:
        self.size += len(piece)
        if self.size > self.max_bytes:
            if self.status != 200:  # an error's start is all that is quoted of it
                self.parts.append(piece[: max(0, MAX_ERROR_BYTES - (self.size - len(piece)))])
                raise Enough
            raise TooLarge(f"the answer is over {self.max_bytes >> 20} MiB")
        self.parts.append(piece)

    @property
    def body(self) -> bytes:
        return b"".join(self.parts)
