"""``laneway serve``: configuration, the listening socket, the workers, uvicorn.

Without API keys configured the server listens on loopback only; a
non-loopback ``--host`` without keys is refused unless ``--insecure``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from laneway import logs
from laneway.arguments import path, port, up_to
from laneway.config import ServerConfig, WorkerConfig, is_loopback, load_config
from laneway.config.urls import is_otlp_traces
from laneway.config.workers import MAX_SLOTS
from laneway.core import ConfigError
from laneway.core.gpu_placement import GpuPlacement
from laneway.logs import FORMATS, LEVELS

if TYPE_CHECKING:
    from laneway.backends.base import Worker

log = logging.getLogger("laneway")


class ServeError(Exception):
    """A problem the user can fix before the server starts (one line, exit 2)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=path, metavar="FILE", help="TOML configuration (docs/config.md)")
    p.add_argument("--host", metavar="H", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port, metavar="P", help="port (default 8000)")
    p.add_argument(
        "--model",
        metavar="SPEC",
        help=(
            "serve this model on one in-process worker: builtin:smollm2 (default; SmolLM2-135M-Instruct,"
            " prepared once into the cache), builtin:tiny, builtin:small or a model directory"
        ),
    )
    p.add_argument("--slots", type=up_to(MAX_SLOTS), metavar="N", help="slots of each worker (default 4)")
    p.add_argument("--data-dir", type=path, metavar="DIR", help="where state is kept (default ./.laneway)")
    p.add_argument(
        "--insecure", action="store_true", help="allow a non-loopback --host without API keys configured"
    )
    p.add_argument(
        "--access-log",
        action="store_true",
        help="log every HTTP request and every request that ends (off by default: it costs CPU)",
    )
    p.add_argument(
        "--otlp-traces-endpoint",
        metavar="URL",
        help="send OpenTelemetry traces there (OTLP/HTTP, e.g. http://127.0.0.1:4318/v1/traces; "
        "needs pip install 'laneway[otel]')",
    )
    p.add_argument("--log-level", choices=LEVELS, default="info", help="default: info")
    p.add_argument(
        "--log-format", choices=FORMATS, default="text", help="text (default) or json: one object per line"
    )


def resolve(args: argparse.Namespace) -> ServerConfig:
    """The configuration file (or the defaults) with the flags applied on top."""
    config = load_config(args.config) if args.config is not None else ServerConfig()
    changes: dict[str, object] = {}
    if args.host is not None:
        changes["host"] = args.host
    if args.port is not None:
        changes["port"] = args.port
    if args.data_dir is not None:
        changes["data_dir"] = args.data_dir
    if args.otlp_traces_endpoint is not None:
        if not is_otlp_traces(args.otlp_traces_endpoint):
            raise ServeError(
                f"argument --otlp-traces-endpoint: an OTLP/HTTP URL such as "
                f"http://127.0.0.1:4318/v1/traces, got {args.otlp_traces_endpoint!r}"
            )
        changes["otlp_traces_endpoint"] = args.otlp_traces_endpoint
    workers = config.workers
    if config.fleet is not None and (args.model is not None or args.slots is not None):
        flag = "--model" if args.model is not None else "--slots"
        raise ServeError(f"argument {flag}: not with a [fleet] (its models and slots are configured)")
    if args.model is not None:
        name = Path(args.model).name if not args.model.startswith("builtin:") else args.model
        workers = (WorkerConfig("w0", "local", args.model, name or args.model, args.slots or 4),)
    elif args.slots is not None:
        for w in workers:
            if w.min_slots > args.slots:
                raise ServeError(
                    f"argument --slots: {args.slots} is under worker {w.name}'s min_slots ({w.min_slots})"
                )
        workers = tuple(replace(w, slots=args.slots) for w in workers)
    return replace(config, workers=workers, **changes)  # type: ignore[arg-type]


def check_exposure(config: ServerConfig, insecure: bool) -> str:
    """The start-up note about keys; refuses a public address without keys."""
    if config.auth:
        note = f"API keys required ({_count(len(config.tenants), 'tenant')})"
        if not config.ops_auth and not is_loopback(config.host):
            note += (  # (/metrics is served either way)
                f"; /metrics{' and the dashboard' if config.dashboard else ''} need none on "
                f"{config.host}: they show tenants, their usage and request ids ([server] ops_auth = true)"
            )
        return note
    if is_loopback(config.host):
        return "no API keys configured: listening on loopback only"
    if not insecure:
        raise ServeError(
            f"refusing to listen on {config.host} without API keys; configure [tenants.NAME] "
            "key_sha256 in --config, or pass --insecure to serve without authentication"
        )
    return f"WARNING: no API keys configured and listening on {config.host} (--insecure): anyone can use it"


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from laneway.api import create_app
    from laneway.backends.factory import build_workers
    from laneway.connections import raise_fd_limit, uvicorn_options
    from laneway.stopping import LanewayServer
    from laneway.store import StoreError, open_store

    signal.signal(signal.SIGTERM, _stop_before_serving)  # (the server has its own once it runs)
    logs.setup(args.log_level, args.log_format, requests=args.access_log)
    try:
        config = resolve(args)
    except ConfigError as exc:
        raise ServeError(str(exc)) from None
    if config.fleet is not None:  # (what only placing it shows: preloads that do not fit together)
        try:
            GpuPlacement(config.fleet.inventory, switch_wait_s=config.fleet.switch_wait_s)
        except ConfigError as exc:
            raise ServeError(f"{args.config}: {exc}") from None
    note = check_exposure(config, args.insecure)
    fd_limit = raise_fd_limit()
    try:
        store = asyncio.run(open_store(config))
    except StoreError as exc:
        raise ServeError(str(exc)) from None
    try:
        sock = bind(config.host, config.port)
    except BaseException:
        asyncio.run(store.close())
        raise
    try:
        workers = asyncio.run(build_workers(config.workers, config.data_dir))
    except BaseException as exc:
        sock.close()
        asyncio.run(store.close())
        if isinstance(exc, ConfigError) and args.config is not None:  # (found as a worker is made)
            raise ServeError(f"{args.config}: {exc}") from None
        raise
    port = sock.getsockname()[1]
    slots = sum(w.capacity().slots for w in workers.values())
    models = ", ".join(config.models)
    if config.fleet is not None:
        inv = config.fleet.inventory
        counted = f"a fleet of {_count(len(inv.gpus), 'GPU')} on {_count(len(inv.nodes), 'node')}, " + (
            f"{_count(len(inv.preload), 'engine')} to start"
            if config.fleet.node is None
            else f"this replica starts the engines of node {config.fleet.node}"
        )
    else:
        counted = f"{_count(len(workers), 'worker')}, {_count(slots, 'slot')}"
    url = base_url(config.host, port)
    logs.say(f"serving {models} on {url} ({counted}); {note}", url=url)
    startup_facts(config, workers)
    if config.cluster is not None:
        c = config.cluster
        logs.say(f"replica {c.replica}: files and batches shared in Redis at {c.redis_url}")
    if store.db.recovered:
        logs.say(f"{store.db.recovered} batch lines left running by the last run will run again")
    app = create_app(config, workers, store)
    limits = uvicorn_options(
        config.header_timeout_s,
        config.body_timeout_s,
        config.keep_alive_s,
        config.max_connections,
        fd_limit,
        config.max_header_bytes,
    )
    server = LanewayServer(
        uvicorn.Config(
            app,
            log_config=None,  # (laneway.logs configured them)
            log_level=args.log_level,
            access_log=args.access_log,
            lifespan="on",
            ws="none",
            **limits,
        ),
        app,
        config.shutdown_grace_s,
    )
    server.run(sockets=[sock])
    return 0


def startup_facts(config: ServerConfig, workers: Mapping[str, Worker]) -> None:
    """At INFO: the workers, tenants and classes the server runs with."""
    for w in config.workers:
        if w.name in workers:
            where = w.url if w.type == "upstream" else w.model
            said = [
                "isolate (urgent work runs alone)" if w.isolate else "",
                "forward_priority (each request's class as vLLM's priority)" if w.forward_priority else "",
            ]
            log.info(
                "worker %s: %s %s serving %s, %d slots%s",
                w.name,
                w.type,
                where,
                w.served_name,
                workers[w.name].capacity().slots,
                "".join(f"; {x}" for x in said if x),
                extra={"worker": w.name, "type": w.type, "model": w.served_name},
            )
    same_engine: dict[tuple[str, str], str] = {}
    for w in config.workers:
        if w.type != "upstream" or w.url is None:
            continue
        key = (w.url.rstrip("/"), w.model)
        first = same_engine.setdefault(key, w.name)
        if first != w.name:
            log.warning(
                "workers %s and %s send %s to the same engine (%s): it is sent the slots of both "
                "at once, past each one's ceiling; one worker per engine and model",
                first,
                w.name,
                w.model,
                w.url,
            )
    classes = config.scheduler.classes.classes
    log.info(
        "classes: %s; policy %s",
        ", ".join(
            f"{c.name} (timeout {'none' if c.timeout_s is None else f'{c.timeout_s:g} s'})" for c in classes
        ),
        config.policy,
    )
    if config.tenants:
        log.info("tenants: %s", ", ".join(t.name for t in config.tenants))


class Stopped(BaseException):
    """SIGTERM before the server was up: it stops, cleanly (``laneway`` exits 0)."""


def _stop_before_serving(sig: int, frame: FrameType | None) -> None:
    raise Stopped


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def base_url(host: str, port: int) -> str:
    """The server's URL: an IPv6 address in brackets, as a URL has it (``http://[::1]:8000``)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
