"""Replicas of ``laneway serve`` sharing one Redis, in front of stand-in engines (tests/cluster)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

from laneway.testing import ServeProcess

REPLICA = """
[server]
data_dir = "{data}"
[cluster]
redis_url = "{redis}"
replica = "{name}"
key_prefix = "{prefix}"
[batches]
poll_s = 0.1
lease_s = 2
{extra}
"""
UPSTREAM = """
[[workers]]
name = "{name}"
type = "upstream"
url = "{url}"
model = "standin"
served_name = "m"
slots = {slots}
token_ids = "none"
"""


def upstream(name: str, url: str, slots: int) -> str:
    return UPSTREAM.format(name=name, url=url, slots=slots)


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
            text = REPLICA.format(data=tmp / name, redis=redis_url, name=name, prefix=prefix, extra=extra)
            cfg.write_text(text + workers)
            started[name] = ServeProcess(["--config", str(cfg)], tmp / f"{name}.log")
        yield started
    finally:
        for s in started.values():
            s.stop()
