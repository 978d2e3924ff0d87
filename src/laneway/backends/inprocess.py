"""An upstream in this very process: the upstream client (:class:`~laneway.backends.http.Pool`)
connected to an ASGI app — the stand-in engine (:class:`laneway.standin.StandIn`), a
deliberately broken engine — through in-memory transports instead of sockets.

Both sides run their real HTTP code: the client's protocol and parser on one end, uvicorn's
server protocol for the app on the other (as ``laneway serve`` runs it), and bytes go
between them in order, one loop turn each way. What a socket adds is left out: the kernel,
ports, other processes. So the upstream worker's logic (requests, streams, cancels,
preemptions, misbehaving answers) is tested in-process, in milliseconds, the way httpx's
``MockTransport`` does for its client; tests of real processes and a real vLLM stay as they
are.

    engine = StandIn(slots=2, ms_per_token=1)
    worker = UpstreamWorker("up", "http://standin/v1", "standin", connect=InProcess(engine))
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

ProtocolFactory = Callable[[], asyncio.Protocol]


class _Pipe(asyncio.Transport):
    """One end of an in-memory connection: what its protocol writes reaches the other end's
    protocol on a later turn of the loop, in order; closing either end closes both."""

    def __init__(self, loop: asyncio.AbstractEventLoop, own: asyncio.Protocol, name: tuple[str, int]) -> None:
        super().__init__()
        self._loop = loop
        self._own = own
        self._name = name
        self.other: _Pipe | None = None
        self._closing = False
        self._lost = False

    # ------------------------------------------------------------ writing
    def write(self, data: bytes | bytearray | memoryview) -> None:
        other = self.other
        if self._closing or other is None or other._closing:
            return
        self._loop.call_soon(other._receive, bytes(data))

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def _receive(self, data: bytes) -> None:
        if not self._lost:
            self._own.data_received(data)

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    # ------------------------------------------------------------ reading (no flow control)
    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_reading(self) -> bool:
        return not self._closing

    # ------------------------------------------------------------ closing
    def close(self) -> None:
        for end in (self, self.other):
            if end is not None and not end._closing:
                end._closing = True
                self._loop.call_soon(end._connection_lost)

    def abort(self) -> None:
        self.close()

    def is_closing(self) -> bool:
        return self._closing

    def _connection_lost(self) -> None:
        if not self._lost:
            self._lost = True
            self._own.connection_lost(None)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self.other._name if self.other is not None else default
        if name == "sockname":
            return self._name
        return default


class InProcess:
    """A connector for :class:`~laneway.backends.http.Pool` (its ``connect``): each connection
    it makes is served by ``app`` in this process, through uvicorn's HTTP protocol."""

    def __init__(self, app: Any) -> None:
        self.config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
        self.config.load()
        self.state = ServerState()
        self.app_state: dict[str, Any] = {}
        self.made = 0  # connections made so far

    async def __call__(self, protocol: ProtocolFactory) -> tuple[asyncio.Transport, asyncio.Protocol]:
        loop = asyncio.get_running_loop()
        client = protocol()
        server = HttpToolsProtocol(self.config, self.state, self.app_state, _loop=loop)
        self.made += 1
        client_end = _Pipe(loop, client, ("127.0.0.1", 40000 + self.made))
        server_end = _Pipe(loop, server, ("127.0.0.1", 8000))
        client_end.other, server_end.other = server_end, client_end
        server.connection_made(server_end)
        client.connection_made(client_end)
        return client_end, client
