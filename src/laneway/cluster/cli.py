"""``laneway cluster``: what an operator asks of a cluster's Redis.

    laneway cluster status --config FILE       who leads, which replicas live, any loss
    laneway cluster accept-loss --config FILE  go on after Redis lost laneway's data

When Redis comes back without what the cluster wrote (restarted empty, from an
older copy), every replica refuses new files and batches and starts no batch
line until an operator has restored what could be restored and accepted what
could not (:mod:`laneway.cluster.node`); ``accept-loss`` is that acceptance.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from laneway.cluster.generation import Loss
from laneway.core import ConfigError, LanewayError


class ClusterCliError(LanewayError):
    """A cluster command that cannot be carried out (one line)."""


def add_arguments(p: argparse.ArgumentParser, parser_class: Any) -> None:
    sub = p.add_subparsers(dest="cluster_command", metavar="COMMAND", parser_class=parser_class)
    sub.required = True
    for name, text in (
        ("status", "who leads, which replicas live, and whether Redis lost laneway's data"),
        ("accept-loss", "go on after Redis lost laneway's data: new files and batches are taken again"),
    ):
        c = sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        c.add_argument(
            "--config", type=Path, required=True, metavar="FILE", help="a replica's TOML configuration"
        )
        c.set_defaults(run=cmd_cluster)


def _client(config_path: Path) -> tuple[Any, str]:
    import redis

    from laneway.bus import BusUnavailable, connect_sync
    from laneway.config import load_config

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise ClusterCliError(str(exc)) from None
    if config.cluster is None:
        raise ClusterCliError(f"{config_path}: no [cluster] table: this server is not a replica of a cluster")
    c = config.cluster
    try:
        client = connect_sync(c.redis_url)
        client.ping()
    except (redis.RedisError, BusUnavailable) as exc:
        raise ClusterCliError(f"cannot reach Redis at {c.redis_url}: {exc}") from None
    return client, c.key_prefix


def cmd_cluster(args: argparse.Namespace) -> int:
    from laneway.cluster.agreement import KEY, live_replicas, told

    client, p = _client(args.config)
    try:
        raw = client.get(p + "lost")
        loss = Loss.from_json(raw) if raw else None
        if args.cluster_command == "accept-loss":
            if loss is None:
                print("no loss to accept: Redis holds what the cluster wrote")
                return 0
            accepted = {"at": time.time(), "loss": json.loads(raw)}
            pipe = client.pipeline(transaction=True)
            pipe.set(p + "lost:accepted", json.dumps(accepted))
            pipe.delete(p + "lost")
            pipe.execute()
            lost = client.hlen(p + "lostids")
            print(
                f"accepted: {loss.message}. Replicas take new files and batches again within a few "
                f"seconds; {lost} batches and files known lost answer 410"
            )
            return 0
        holder = client.get(p + "leader")
        leader = holder.decode().rpartition("|")[0] if holder else "none"
        keys = list(client.scan_iter(match=p + "alive:*"))
        alive = sorted(k.decode().removeprefix(p + "alive:") for k in keys)
        print(f"leader: {leader}")
        print(f"replicas alive: {', '.join(alive) or 'none'}")
        names = sorted(live_replicas(p, keys))
        written = dict(zip(names, client.mget([p + KEY + n for n in names]), strict=True)) if names else {}
        first = next((n for n in names if written[n] is not None), None)
        lines = [] if first is None else told(first, json.loads(written[first]), written)
        print("configurations: " + ("; ".join(lines) if lines else "the same on every replica alive"))
        print(f"lost: {loss.message}" if loss else "lost: nothing (Redis holds what the cluster wrote)")
        return 0
    finally:
        client.close()
