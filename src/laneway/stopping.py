"""How ``laneway serve`` stops: uvicorn's server with laneway's shutdown.

- The first SIGINT / SIGTERM stops accepting connections and gives running
  requests ``grace_s`` seconds to finish (``None``: as long as they take); batch work
  starts no new line, and the lines in flight have the same grace.
- Then, or at once on a second Ctrl-C or SIGTERM, batch work stops where it is (its
  lines run again at the next start) and every other request ends: a waiting
  client gets 503 "the server is shutting down", a stream gets that error as
  its last event. The connections close and the server exits cleanly.
- A third Ctrl-C forces the exit: uvicorn's own, and the engines a fleet started are
  killed at once (their stop grace not waited for).
- A shutdown that went as planned exits with status 0 (SIGTERM included: what
  a container's stop sends).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType

import uvicorn
from starlette.applications import Starlette

from laneway import logs


class LanewayServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: Starlette, grace_s: float | None) -> None:
        super().__init__(config)
        self.app = app
        self.grace_s = grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ending = False  # requests are being ended (a further Ctrl-C forces the exit)
        # uvicorn's own "(CTRL+C to force quit)" hints: here the next Ctrl-C ends requests
        logging.getLogger("uvicorn.error").addFilter(_without_force_quit_hints)

    async def startup(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)  # type: ignore[arg-type]

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, less its raising the signal again once the server has stopped: a
        shutdown asked for by SIGTERM or Ctrl-C that went as planned exits with status 0."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        # (the loop known from here: a signal while uvicorn still loads the app, before
        # start-up, is a shutdown like any other, said as one)
        self._loop = asyncio.get_running_loop()
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # a signal handler: it only hands work to the event loop
        loop = self._loop
        self.app.state.stopping = True  # (the dashboard's streams end: they hold no request)
        if not self.should_exit:
            super().handle_exit(sig, frame)
            if loop is not None:  # (before start-up, uvicorn stops without serving)
                loop.call_soon_threadsafe(self._grace)
                starting = getattr(self.app.state, "starting", None)
                if starting is not None:  # still starting: what it starts is stopped
                    loop.call_soon_threadsafe(starting.cancel)
        elif not self._ending and loop is not None:  # a second Ctrl-C or SIGTERM
            self._ending = True
            loop.call_soon_threadsafe(
                self._end_requests, "ending every request now (Ctrl-C again: force the exit)"
            )
        else:
            super().handle_exit(sig, frame)
            if loop is not None:
                loop.call_soon_threadsafe(self._force)

    def _force(self) -> None:
        fleet = getattr(getattr(self.app.state, "runtime", None), "fleet", None)
        if fleet is not None and fleet.kill():
            _say("forcing the exit: the engines are killed")

    def _grace(self) -> None:
        batches = getattr(self.app.state, "batches", None)
        if batches is not None:  # no line starts; those in flight have the grace too
            batches.drain()
        grace = self.grace_s
        when = "as long as they take" if grace is None else f"{grace:g} s to finish"
        _say(f"shutting down: running requests have {when} (Ctrl-C again: end them now)")
        if grace is not None:
            asyncio.get_running_loop().call_later(
                grace, self._end_requests, "grace period over: ending every request"
            )

    def _end_requests(self, why: str) -> None:
        state = self.app.state
        runtime = getattr(state, "runtime", None)
        if runtime is None or runtime.closed:
            return  # the application is closing already
        self._ending = True
        _say(why)
        asyncio.get_running_loop().create_task(self._stop_work())

    async def _stop_work(self) -> None:
        state = self.app.state
        batches = getattr(state, "batches", None)
        if batches is not None and not batches.closed:
            await batches.close()  # first, so that no batch line is answered "shutting down"
        runtime = state.runtime
        if not runtime.closed:
            runtime.end_requests()


def _without_force_quit_hints(record: logging.LogRecord) -> bool:
    return "(CTRL+C to force quit)" not in record.getMessage()


def _say(message: str) -> None:
    logs.say(message)
