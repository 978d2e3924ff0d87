"""Whether the replicas of a cluster schedule by the same configuration.

Only the leader's core decides, by its own replica's configuration: its policy, classes,
``[scheduler]`` and workers (slots, models, ``isolate`` …). A replica started with another
configuration would change how the whole cluster schedules when it becomes leader, and
nothing said so. Each replica now writes what its core decides by under ``PREFIX
config:REPLICA`` as it joins, and compares it with the live replicas' (those with an
``alive:REPLICA.*`` key): each difference is named in one warning at start.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis

from laneway.cluster.redis_io import text
from laneway.core import SchedulerConfig, WorkerSpec

log = logging.getLogger("laneway.cluster")

NAMED_AT_MOST = 8  # differences named in the warning (the rest counted)
KEY = "config:"  # PREFIX config:REPLICA: what that replica's core schedules by (JSON)


def _plain(value: object) -> object:
    """``value`` as JSON would hold it: sets sorted, mappings and dataclasses as objects."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, frozenset | set):
        return sorted(_plain(v) for v in value)  # type: ignore[type-var]
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def decided_by(policy: str, config: SchedulerConfig, specs: Sequence[WorkerSpec]) -> dict[str, Any]:
    """What a leader's core schedules by: its policy, ``[scheduler]`` (classes, tenants, costs
    included) and each worker, by name."""
    scheduler = _plain(config)
    assert isinstance(scheduler, dict)
    return {
        "policy": policy,
        **{f"scheduler.{k}": v for k, v in scheduler.items()},
        **{f"workers.{s.id}": _plain(s) for s in specs},
    }


def differences(mine: Mapping[str, Any], theirs: Mapping[str, Any], path: str = "") -> list[str]:
    """Each setting where two replicas differ, named by its path with both values (within
    a table, each key of it that differs: a worker's field, a tenant's quota …)."""
    out: list[str] = []
    for key in sorted(mine.keys() | theirs.keys()):
        name = f"{path}{key}"
        if key not in theirs or key not in mine:
            out.append(f"{name}: {'only here' if key not in theirs else 'only there'}")
            continue
        a, b = mine[key], theirs[key]
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, name + ".")
        else:
            out.append(f"{name}: {_said(a)} here, {_said(b)} there")
    return out


def _said(value: object) -> str:
    said = json.dumps(value, sort_keys=True)
    return said if len(said) <= 80 else said[:77] + "..."


def told(replica: str, mine: Mapping[str, Any], others: Mapping[str, bytes | str | None]) -> list[str]:
    """One line for each replica in ``others`` (its name -> the settings it wrote, or
    ``None``) whose settings differ from ``mine``, naming each difference."""
    lines: list[str] = []
    for other, raw in sorted(others.items()):
        if other == replica or raw is None:
            continue  # (a replica of a version that writes none)
        try:
            theirs = json.loads(raw)
        except ValueError:
            continue
        found = differences(mine, theirs) if isinstance(theirs, dict) else []
        if not found:
            continue
        named = "; ".join(found[:NAMED_AT_MOST])
        more = f"; and {len(found) - NAMED_AT_MOST} more" if len(found) > NAMED_AT_MOST else ""
        lines.append(
            f"replica {replica!r} schedules by another configuration than replica {other!r} "
            f"({named}{more}): the leader's decides for all, so scheduling changes with the leader"
        )
    return lines


def live_replicas(prefix: str, alive_keys: Iterable[bytes | str]) -> set[str]:
    """The names of the replicas whose ``alive:REPLICA.HOME`` keys these are."""
    return {text(key).removeprefix(prefix + "alive:").rsplit(".", 1)[0] for key in alive_keys}


async def compare(client: aioredis.Redis, prefix: str, replica: str, mine: Mapping[str, Any]) -> list[str]:
    """Write this replica's settings, and warn of each live replica whose settings differ
    (one line each); the warnings, as logged."""
    await client.set(prefix + KEY + replica, json.dumps(mine, sort_keys=True))
    keys = [key async for key in client.scan_iter(match=prefix + "alive:*", count=1000)]
    live = live_replicas(prefix, keys)
    names = sorted(live - {replica})
    others = (
        dict(zip(names, await client.mget([prefix + KEY + n for n in names]), strict=True)) if names else {}
    )
    warnings = told(replica, mine, others)
    for line in warnings:
        log.warning("%s", line)
    return warnings
