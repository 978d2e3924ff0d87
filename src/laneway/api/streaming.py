"""Waiting on a ticket while watching for the client to go away.

A client that disconnects (while queued, while its text streams, or while a
non-streaming answer is being made) cancels its request: the runtime frees
the slot at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class DisconnectWatch:
    """Calls ``on_disconnect`` if the client goes away before :meth:`stop`.

    One task per request, reading ``receive`` (the body already read) until
    the disconnect; what the handler waits on is woken by ``on_disconnect``
    (the runtime ends the ticket), so the handler itself awaits its ticket
    directly. :meth:`stop` before the response is sent: once a response is
    complete the server reports a disconnect.
    """

    __slots__ = ("_on_disconnect", "_task", "gone")

    def __init__(self, receive: Receive, on_disconnect: Callable[[], None]) -> None:
        self.gone = False
        self._on_disconnect = on_disconnect
        self._task = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        await _disconnected(receive)
        self.gone = True
        self._on_disconnect()

    def stop(self) -> None:
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

        async def watch() -> None:
            await _disconnected(receive)
            if not finished:
                self.on_disconnect()

        watcher = asyncio.ensure_future(watch())
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
            watcher.cancel()
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                await aclose()
