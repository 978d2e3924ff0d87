"""A real uvicorn server on 127.0.0.1 (a free port), run on a thread, always stopped."""

from __future__ import annotations

import contextlib
import resource
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import uvicorn

from laneway.api import create_app
from laneway.backends.base import Worker
from laneway.config import ServerConfig, WorkerConfig
from laneway.connections import uvicorn_options
from laneway.runtime import Runtime

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


@dataclass
class LiveServer:
    url: str  # http://127.0.0.1:PORT
    server: uvicorn.Server
    app: object

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def runtime(self) -> Runtime:
        return self.app.state.runtime  # type: ignore[attr-defined,no-any-return]


def simulated(slots: int = 2, tokens_per_s: float | None = 200.0, name: str = "sim0") -> WorkerConfig:
    return WorkerConfig(
        name, type="simulated", model="sim", served_name="sim", slots=slots, tokens_per_s=tokens_per_s
    )


def sim_config(
    tmp_path: Path, slots: int = 2, tokens_per_s: float | None = 200.0, **kw: object
) -> ServerConfig:
    return replace(ServerConfig(), workers=(simulated(slots, tokens_per_s),), data_dir=tmp_path, **kw)  # type: ignore[arg-type]


@contextlib.contextmanager
def live_server(config: ServerConfig, workers: Mapping[str, Worker] | None = None) -> Iterator[LiveServer]:
    app = create_app(config, workers)
    limits = uvicorn_options(
        config.header_timeout_s,
        config.body_timeout_s,
        config.keep_alive_s,
        config.max_connections,
        resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        config.max_header_bytes,
    )
    cfg = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", ws="none", **limits
    )
    server = uvicorn.Server(cfg)
    thread = threading.Thread(target=server.run, name="laneway-test-server", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield LiveServer(f"http://127.0.0.1:{port}", server, app)
    finally:
        server.should_exit = True
        thread.join(STOP_TIMEOUT_S)
        assert not thread.is_alive(), "the test server did not stop"


@contextlib.contextmanager
def serving(app: Any, path: str = "/v1") -> Iterator[str]:
    """Any ASGI ``app`` (a fake engine) on 127.0.0.1, a free port, on a thread: its URL with
    ``path``; always stopped."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", ws="none")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}{path}"
    finally:
        server.should_exit = True
        thread.join(STOP_TIMEOUT_S)
