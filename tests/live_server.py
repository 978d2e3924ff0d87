"""A real uvicorn server on 127.0.0.1 (a free port), run on a thread, always stopped."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

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


def tiny(slots: int = 4, name: str = "w0") -> WorkerConfig:
    """An in-process worker on ``builtin:tiny`` (fast; the default model is SmolLM2)."""
    return WorkerConfig(name, model="builtin:tiny", served_name="builtin:tiny", slots=slots)


def simulated(slots: int = 2, tokens_per_s: float | None = 200.0, name: str = "sim0") -> WorkerConfig:
    return WorkerConfig(
        name, type="simulated", model="sim", served_name="sim", slots=slots, tokens_per_s=tokens_per_s
    )


def upstream(name: str, url: str, **kw: Any) -> WorkerConfig:
    """An upstream worker of model ``m`` (one slot, no token ids: a fake upstream's)."""
    fields: dict[str, Any] = {"model": "m", "served_name": "m", "slots": 1, "token_ids": "none", **kw}
    return WorkerConfig(name, type="upstream", url=url, **fields)


def sim_config(
    tmp_path: Path, slots: int = 2, tokens_per_s: float | None = 200.0, **kw: object
) -> ServerConfig:
    return replace(ServerConfig(), workers=(simulated(slots, tokens_per_s),), data_dir=tmp_path, **kw)  # type: ignore[arg-type]


def _uvicorn(config: ServerConfig, app: Any) -> uvicorn.Server:
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
    return uvicorn.Server(cfg)


@contextlib.contextmanager
def live_servers(
    servers: Sequence[tuple[ServerConfig, Mapping[str, Worker] | None]],
) -> Iterator[list[LiveServer]]:
    """Several servers in one event loop on one thread, started in turn (each once the one
    before it serves), stopped together: replicas of a cluster on an in-process bus
    (``memory://``) whose workers reach in-process engines of that same loop."""
    apps = [create_app(config, workers) for config, workers in servers]
    started = [_uvicorn(config, app) for (config, _), app in zip(servers, apps, strict=True)]
    failed: list[BaseException] = []
    loops: list[asyncio.AbstractEventLoop] = []

    async def main() -> None:
        loops.append(asyncio.get_running_loop())
        tasks = []
        try:
            for server in started:
                tasks.append(asyncio.create_task(server.serve()))
                deadline = time.monotonic() + START_TIMEOUT_S
                while not server.started and not tasks[-1].done() and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                if not server.started:  # (it failed: the others stop too, the test is told)
                    for other in started:
                        other.should_exit = True
                    break
        finally:
            await asyncio.gather(*tasks, return_exceptions=True)

    def run() -> None:
        try:
            # one server: on the loop uvicorn itself would choose, as Server.run (uvloop where
            # installed); several (a cluster in one process): on asyncio's own
            factory = started[0].config.get_loop_factory() if len(started) == 1 else None
            with asyncio.Runner(loop_factory=factory) as runner:
                runner.run(main())
        except BaseException as exc:  # (told to the test below)
            failed.append(exc)

    thread = threading.Thread(target=run, name="laneway-test-servers", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S * len(started)
        while not all(s.started for s in started):
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the test servers did not start: {failed}")
            time.sleep(0.01)
        yield [
            LiveServer(f"http://127.0.0.1:{s.servers[0].sockets[0].getsockname()[1]}", s, app)
            for s, app in zip(started, apps, strict=True)
        ]
    finally:
        for s in started:
            s.should_exit = True
        thread.join(STOP_TIMEOUT_S * len(started))
        assert not thread.is_alive(), "the test servers did not stop:\n" + _stuck(thread, loops)


def _stuck(thread: threading.Thread, loops: list[asyncio.AbstractEventLoop]) -> str:
    """Where a server thread that does not stop is: its stack, and each task of its loop."""
    frame = sys._current_frames().get(thread.ident or -1)
    out = ["the thread:", "".join(traceback.format_stack(frame)) if frame else "(gone)"]
    if loops:

        async def tasks() -> str:
            lines = []
            for task in asyncio.all_tasks():
                if task is asyncio.current_task():
                    continue
                lines.append(f"{task.get_name()}:")
                coro: Any = task.get_coro()
                while coro is not None:  # (the chain of awaits, through async context managers)
                    frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
                    if frame is None:
                        break
                    lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
                    gen = getattr(frame.f_locals.get("self"), "gen", None)
                    if hasattr(gen, "ag_frame"):
                        coro = gen
                    else:
                        coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
                if coro is not None:
                    lines.append(f"  awaiting {coro!r}")
            return "\n".join(lines)

        try:
            out.append(asyncio.run_coroutine_threadsafe(tasks(), loops[0]).result(timeout=5))
        except Exception as exc:  # (the loop itself is stuck: the thread's stack says where)
            out.append(f"(its tasks could not be listed: {exc!r})")
    return "\n".join(out)


@contextlib.contextmanager
def live_server(config: ServerConfig, workers: Mapping[str, Worker] | None = None) -> Iterator[LiveServer]:
    with live_servers([(config, workers)]) as (one,):
        yield one


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


T = TypeVar("T")
U = TypeVar("U")


@dataclass
class Overtaken(Generic[T, U]):
    low: T  # the low-class request's answer
    urgent: U  # the urgent one's
    urgent_first: bool  # the urgent one was answered before the low one


def overtaken(
    runtime: Runtime,
    low: Callable[[], T],
    urgent: Callable[[], U],
    going: Callable[[Any], bool],
    timeout_s: float = 120.0,
) -> Overtaken[T, U]:
    """``low()`` on a thread; once a ticket of the runtime is ``going`` (running, some tokens
    made), ``urgent()`` here. Both answers, and which came first (bounded waits; what ``low``
    raised is raised here)."""
    out: list[Any] = []
    ended: list[float] = []

    def run() -> None:
        try:
            out.append(low())
        except BaseException as exc:  # re-raised below
            out.append(exc)
        ended.append(time.monotonic())

    t = threading.Thread(target=run)
    t.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not out:
            if any(going(tk) for tk in list(runtime.tickets.values())):
                break
            time.sleep(0.005)
        else:
            raise AssertionError(f"the low-class request never got going: {out}")
        answer = urgent()
        urgent_done = time.monotonic()
    finally:
        t.join(timeout_s)
    assert out and ended, "the low-class request did not finish"
    if isinstance(out[0], BaseException):
        raise out[0]
    return Overtaken(out[0], answer, urgent_done < ended[0])
