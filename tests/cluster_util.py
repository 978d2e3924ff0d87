"""Replicas of ``laneway serve`` sharing one Redis, in front of stand-in engines (tests/cluster)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

from laneway.backends.factory import build_upstream
from laneway.backends.inprocess import InProcess
from laneway.config import load_config
from laneway.fault_harness import replica_toml, upstream_toml
from laneway.standin import StandIn
from laneway.testing import ServeProcess
from live_server import LiveServer, live_servers


def upstream(name: str, url: str, slots: int) -> str:
    return upstream_toml(name, url, slots, token_ids="none")


@contextlib.contextmanager
def replicas(
    tmp: Path, redis_url: str, names: list[str], workers: str, extra: str = "", prefix: str | None = None
) -> Iterator[dict[str, ServeProcess]]:
    """Replicas ``names`` (one config but their names), keys of their own in the Redis
    (under ``prefix``, by default a new one)."""
    prefix = prefix or f"c{uuid.uuid4().hex[:8]}:"
    started: dict[str, ServeProcess] = {}
    try:
        for name in names:
            cfg = tmp / f"{name}.toml"
            text = replica_toml(tmp / name, redis_url, name, prefix, extra=extra)
            cfg.write_text(text + workers)
            started[name] = ServeProcess(["--config", str(cfg)], tmp / f"{name}.log")
        yield started
    finally:
        for s in started.values():
            s.stop()


@contextlib.contextmanager
def inprocess_replicas(
    tmp: Path,
    bus_url: str,
    names: list[str],
    engines: Mapping[str, StandIn],
    slots: int | Mapping[str, int],
    extra: str = "",
    cluster: Mapping[str, str] | None = None,
) -> Iterator[dict[str, LiveServer]]:
    """Replicas ``names`` in this process (one event loop, :func:`live_server.live_servers`) on
    the in-process bus ``bus_url`` (``memory://``), each with an upstream worker of ``slots``
    (or of its own, by replica) for each of ``engines`` (worker name -> a stand-in engine's
    app, reached in-process too), and ``cluster``'s lines in its ``[cluster]`` table (by
    replica): the replicas' configuration read as :func:`replicas` writes it, the same HTTP,
    leader, lease and Lua scripts, no process started."""
    prefix = f"c{uuid.uuid4().hex[:8]}:"
    servers = []
    for name in names:
        n = slots if isinstance(slots, int) else slots[name]
        workers = "".join(upstream(w, f"http://{w}.invalid/v1", n) for w in engines)
        text = replica_toml(tmp / name, bus_url, name, prefix, extra=extra)
        lines = (cluster or {}).get(name)
        if lines:
            text = text.replace("[batches]\n", lines.rstrip("\n") + "\n[batches]\n", 1)
        path = tmp / f"{name}.toml"
        path.write_text(text + workers)
        config = load_config(path)
        built = {w.name: build_upstream(w, connect=InProcess(engines[w.name])) for w in config.workers}
        servers.append((config, built))
    with live_servers(servers) as started:
        yield dict(zip(names, started, strict=True))
