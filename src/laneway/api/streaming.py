"""Waiting on a ticket while watching for the client to go away.

A client that disconnects (while queued, while its text streams, or while a
non-streaming answer is being made) cancels its request: the runtime frees
the slot as soon as that is seen.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

WATCH_AFTER_S = 0.05
"""How long a handler waits for its answer before it watches for its client leaving."""


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class DisconnectWatch:
    """Calls ``on_disconnect`` if the client goes away before :meth:`stop`.

    The watch starts ``after_s`` in (:data:`WATCH_AFTER_S`): an answer ready sooner never
    needs one, and most are (a task a request, and its reads, were ~10 % of the gateway's CPU
    on a 1-token chat); a client gone before then is seen then. Once started it is one task, reading
    ``receive`` (the body already read) until the disconnect; what the handler waits on is
    woken by ``on_disconnect`` (the runtime ends the ticket), so the handler itself awaits
    its ticket directly. :meth:`stop` before the response is sent: once a response is
    complete the server reports a disconnect.
    """

    __slots__ = ("_on_disconnect", "_receive", "_task", "_timer", "gone")

    def __init__(
        self, receive: Receive, on_disconnect: Callable[[], None], after_s: float = WATCH_AFTER_S
    ) -> None:
        self.gone = False
        self._on_disconnect = on_disconnect
        self._receive = receive
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(after_s, self._begin)

    def _begin(self) -> None:
        self._timer = None
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        await _disconnected(self._receive)
        self.gone = True
        self._on_disconnect()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            self._task.cancel()


class EventStream(Response):
    """A ``text/event-stream`` response that calls ``on_disconnect`` if the
    client goes away before the stream ends."""

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncIterator[bytes], on_disconnect: Callable[[], None]) -> None:
        # no Response.__init__: it would render an empty body with Content-Length: 0
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no"})
        self.chunks = chunks
        self.on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        finished = False
        watch = DisconnectWatch(receive, lambda: None if finished else self.on_disconnect())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            finished = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the connection is gone
            if not finished:
                self.on_disconnect()
        finally:
            finished = True
            watch.stop()
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                await aclose()
