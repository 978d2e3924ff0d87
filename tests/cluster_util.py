"""Replicas of ``laneway serve`` sharing one Redis, in front of stand-in engines (tests/cluster)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

from laneway.fault_harness import replica_toml, upstream_toml
from laneway.testing import ServeProcess


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
