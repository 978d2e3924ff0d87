"""The TOML configuration file → :class:`~laneway.config.schema.ServerConfig`.

The format is documented in ``docs/config.md``; ``examples/laneway.toml`` uses
every section. Every mistake raises :class:`~laneway.core.ConfigError` with a
message that starts with the key (``workers[1].slots: must be >= 1, got 0``).
"""

from __future__ import annotations

import os
import socket
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from laneway.config.fields import Table, parse_rank, rank
from laneway.config.fleet import parse_fleet
from laneway.config.schema import (
    DEFAULT_ALERT_WAIT_S,
    DEFAULT_SERVICE_TIERS,
    SERVER_SCHEDULER,
    BatchConfig,
    ClusterConfig,
    ServerConfig,
)
from laneway.config.tenants import parse_tenants
from laneway.config.urls import is_otlp_traces, split
from laneway.config.workers import parse_workers
from laneway.core import ClassTable, ConfigError, CostModel, SchedulerConfig
from laneway.core.policies import POLICIES

MAX_TOML_BYTES = 16 * 2**20  # (a configuration is a few KiB; /dev/zero given for one is not read to the end)


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML file at ``path``; :class:`ConfigError` naming the file if it is not valid."""
    with path.open("rb") as f:
        raw = f.read(MAX_TOML_BYTES + 1)
    if len(raw) > MAX_TOML_BYTES:
        raise ConfigError(f"{path}: over {MAX_TOML_BYTES >> 20} MiB: not a configuration file")
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None


def load_config(path: Path) -> ServerConfig:
    data = read_toml(path)
    try:
        return parse_config(data)
    except ConfigError as exc:
        raise ConfigError("\n".join(f"{path}: {line}" for line in str(exc).splitlines())) from None


def _otlp(server: Table) -> str | None:
    value = server.str("otlp_traces_endpoint", None)
    if value is not None and not is_otlp_traces(value):
        raise ConfigError(
            f"{server.key('otlp_traces_endpoint')}: an OTLP/HTTP URL such as "
            f"'http://127.0.0.1:4318/v1/traces', got {value!r}"
        )
    return value


def parse_config(data: dict[str, Any]) -> ServerConfig:
    top = Table(data)
    base = ServerConfig()
    server = top.table("server")
    classes = _classes(top.table("classes"))
    names = classes.names
    sched_cfg = _scheduler(top.table("scheduler"), classes)
    default_class = rank(server, "default_priority", names, base.default_priority)
    tenants = parse_tenants(top.table("tenants"), names, default_class)
    policies = {t.name: t.policy for t in tenants}
    sched_cfg = replace(sched_cfg, tenants=policies)
    fleet = parse_fleet(top.raw("fleet"), names) if "fleet" in top else None
    listed = top.list("workers", None)
    if listed is not None and not listed:
        raise ConfigError(
            "workers: an empty list serves nothing; give at least one [[workers]] entry, or leave "
            "workers out for the built-in default"
        )
    workers = parse_workers(listed or [])
    if fleet is not None:
        if workers:
            raise ConfigError(
                "workers: not beside [fleet] (the fleet's engines are this server's workers; "
                "an engine you run yourself belongs in a [[workers]] list without a [fleet])"
            )
    else:
        workers = workers or base.workers
    served = {w.served_name for w in workers} | (set(fleet.inventory.models) if fleet else set())
    aliases = _aliases(top.table("models"), served)
    config = ServerConfig(
        host=server.str("host", base.host),
        port=server.int("port", base.port, low=0, high=65535),
        data_dir=Path(server.str("data_dir", str(base.data_dir))),
        policy=_policy(server),
        default_priority=default_class,
        max_body_bytes=server.int("max_body_bytes", base.max_body_bytes, low=1024),
        default_max_tokens=server.int("default_max_tokens", base.default_max_tokens, low=1),
        shutdown_grace_s=server.float("shutdown_grace_s", base.shutdown_grace_s, optional=True),
        dashboard=server.bool("dashboard", base.dashboard),
        ops_auth=server.bool("ops_auth", base.ops_auth),
        allowed_origins=_origins(server),
        probe_interval_s=server.float("probe_interval_s", base.probe_interval_s, positive=True),
        unavailable_hold_s=server.float("unavailable_hold_s", base.unavailable_hold_s),
        header_timeout_s=server.float("header_timeout_s", base.header_timeout_s, positive=True),
        body_timeout_s=server.float("body_timeout_s", base.body_timeout_s, positive=True),
        keep_alive_s=server.float("keep_alive_s", base.keep_alive_s, positive=True),
        max_connections=server.int("max_connections", base.max_connections, low=16),
        max_header_bytes=server.int("max_header_bytes", base.max_header_bytes, low=1024),
        max_migrations=server.int("max_migrations", base.max_migrations, low=0),
        max_queued_bytes=server.int("max_queued_bytes", base.max_queued_bytes, low=1 << 20),
        otlp_traces_endpoint=_otlp(server),
        workers=workers,
        aliases=aliases,
        scheduler=sched_cfg,
        tenants=tenants,
        alert_wait_s=_alerts(top.table("alerts"), names),
        service_tiers=_tiers(top.table("service_tiers"), names),
        batches=_batches(top.table("batches"), names),
        cluster=_cluster(top.table("cluster")),
        fleet=fleet,
    )
    if fleet is not None and config.cluster is not None and fleet.node is None:
        raise ConfigError(
            "fleet.node: required in a [cluster] (the node whose GPUs this replica starts engines "
            f"on; one of {', '.join(fleet.inventory.nodes)})"
        )
    if fleet is not None and fleet.node is not None and config.cluster is None:
        raise ConfigError("fleet.node: only in a [cluster] (a server alone starts engines on every node)")
    if config.ops_auth and not config.auth:
        raise ConfigError("server.ops_auth: needs API keys ([tenants.NAME] key_sha256) to check")
    if config.cluster is not None and any(w.type == "local" for w in workers):
        raise ConfigError(
            "[cluster]: every worker of a cluster must be reachable by every replica "
            "(type = 'upstream'); an in-process ('local') engine belongs to one process"
        )
    server.done()
    top.done()
    return config


CLUSTER_KEYS = {"redis_url", "replica", "key_prefix", "leader_priority", "lend_max_s", "lend_reserve"}


def _cluster(t: Table) -> ClusterConfig | None:
    url = t.str("redis_url", None)
    if url is None:
        if t.data and set(t.data) <= CLUSTER_KEYS:  # ([cluster]'s own keys need the Redis)
            raise ConfigError(f"{t.key('redis_url')}: required (the Redis the replicas share)")
        t.done()
        return None
    parsed = split(url)  # (memory://NAME: a bus in this process, laneway.bus: for tests)
    if (
        parsed is None
        or parsed.scheme not in ("redis", "rediss", "unix", "memory")
        or not (parsed.hostname or parsed.path or parsed.netloc)
    ):
        raise ConfigError(f"{t.key('redis_url')}: expected redis://HOST:PORT/DB, got {url!r}")
    replica = t.str("replica", f"{socket.gethostname()}-{os.getpid()}")
    if not replica or any(c.isspace() for c in replica):
        raise ConfigError(f"{t.key('replica')}: expected a name without spaces, got {replica!r}")
    out = ClusterConfig(
        url,
        replica,
        t.str("key_prefix", ClusterConfig.key_prefix),
        t.int("leader_priority", ClusterConfig.leader_priority, low=0),
        t.float("lend_max_s", ClusterConfig.lend_max_s, optional=True) or 0.0,  # ("none": nothing lent)
        t.int("lend_reserve", ClusterConfig.lend_reserve, low=0),
    )
    t.done()
    return out


def _batches(t: Table, names: tuple[str, ...]) -> BatchConfig:
    base = BatchConfig()
    out = BatchConfig(
        default_priority=rank(t, "default_priority", names, base.default_priority),
        max_file_bytes=t.int("max_file_bytes", base.max_file_bytes, low=1024),
        max_lines=t.int("max_lines", base.max_lines, low=1),
        max_in_flight=t.int("max_in_flight", base.max_in_flight, low=1),
        max_attempts=t.int("max_attempts", base.max_attempts, low=1),
        lease_s=t.float("lease_s", base.lease_s, positive=True),
        poll_s=t.float("poll_s", base.poll_s, positive=True),
    )
    t.done()
    return out


def _policy(server: Table) -> str:
    """A scheduling policy; the simulator's placement baselines are not served."""
    name = server.str("policy", "laneway")
    served = [n for n, spec in POLICIES.items() if spec.spread is None and spec.placement != "naive"]
    if name not in served:
        hint = ""
        if name in POLICIES and POLICIES[name].spread is not None:
            hint = f' (a placement: [scheduler] placement = "{name}")'
        elif name in POLICIES:
            hint = " (a baseline of `laneway simulate` only)"
        raise ConfigError(
            f"{server.key('policy')}: unknown policy {name!r}{hint}; choose from {', '.join(served)}"
        )
    return str(name)


def _classes(table: Table) -> ClassTable:
    """``[classes.P0]`` tables override the default classes' settings."""
    default = ClassTable()
    out = []
    for c in default.classes:
        if c.name not in table:
            out.append(c)
            continue
        t = table.table(c.name)
        may = t.list("may_preempt", None)
        ranks = c.may_preempt
        if may is not None:
            try:
                ranks = frozenset(parse_rank(v, default.names) for v in may)
            except ValueError as exc:
                raise ConfigError(f"{t.key('may_preempt')}: {exc}") from None
        out.append(
            replace(
                c,
                timeout_s=t.float("timeout_s", c.timeout_s, positive=True, optional=True),
                may_preempt=ranks,
                preemptible=t.bool("preemptible", c.preemptible),
                max_queued=t.int("max_queued", c.max_queued, low=1),
                weight=t.float("weight", c.weight, positive=True),
                service_s=t.float("service_s", c.service_s, positive=True, optional=True),
            )
        )
        t.done()
    for name in table.data:
        if name not in default.names:
            raise ConfigError(
                f"{table.key(name)}: unknown class (the classes are {', '.join(default.names)})"
            )
        table.raw(name)
    return ClassTable(tuple(out))


def _scheduler(table: Table, classes: ClassTable) -> SchedulerConfig:
    base = SERVER_SCHEDULER
    costs_t = table.table("costs")
    cost_base = CostModel()
    costs = CostModel(
        kv_bytes_per_token=costs_t.int("kv_bytes_per_token", cost_base.kv_bytes_per_token, low=0),
        host_link_bytes_s=costs_t.float("host_link_bytes_s", cost_base.host_link_bytes_s, positive=True),
        prefill_tokens_s=costs_t.float("prefill_tokens_s", cost_base.prefill_tokens_s, positive=True),
        decode_tokens_s=costs_t.float("decode_tokens_s", cost_base.decode_tokens_s, positive=True),
        step_s=costs_t.float("step_s", cost_base.step_s),
        default_prompt_tokens=costs_t.int("default_prompt_tokens", cost_base.default_prompt_tokens, low=0),
    )
    costs_t.done()
    try:
        cfg = SchedulerConfig(
            classes=classes,
            aging_interval_s=table.float(
                "aging_interval_s", base.aging_interval_s, positive=True, optional=True
            ),
            aging_ceiling=rank(table, "aging_ceiling", classes.names, base.aging_ceiling),
            drain_cap_s=table.float("drain_cap_s", base.drain_cap_s),
            hold_s=table.float("hold_s", base.hold_s, optional=True) or 0.0,
            max_preempt_loss=table.float("max_preempt_loss", base.max_preempt_loss, optional=True),
            max_preemptions=table.int("max_preemptions", base.max_preemptions, low=0, optional=True),
            max_queued_total=table.int("max_queued_total", base.max_queued_total, low=1),
            max_wait_s=table.float("max_wait_s", base.max_wait_s, positive=True, optional=True),
            costs=costs,
            default_service_s=table.float("default_service_s", base.default_service_s, positive=True),
            fair_tenants=table.bool("fair_tenants", base.fair_tenants),
            fair_prompt_weight=table.float("fair_prompt_weight", base.fair_prompt_weight),
            fair_output_weight=table.float("fair_output_weight", base.fair_output_weight),
            placement=table.str("placement", base.placement),
            prefill_guard=table.bool("prefill_guard", base.prefill_guard),
        )
    except ConfigError as exc:  # the core names its own fields: here they are the table's
        if str(exc).startswith(table.key("")):
            raise
        raise ConfigError(table.key(str(exc))) from None
    table.done()
    return cfg


def _aliases(table: Table, served: set[str]) -> dict[str, str]:
    """``[models.NAME] aliases = [...]``: other names clients may use for NAME."""
    out: dict[str, str] = {}
    for name in list(table.data):
        t = table.table(name)
        if name not in served:
            raise ConfigError(f"{t.path}: no worker serves model {name!r}")
        for alias in t.list("aliases", []):
            if not isinstance(alias, str) or not alias:
                raise ConfigError(f"{t.key('aliases')}: expected a list of names")
            if alias in served:  # (its own model could no longer be reached)
                raise ConfigError(f"{t.key('aliases')}: {alias!r} is the name of a model served already")
            if alias in out:
                raise ConfigError(f"{t.key('aliases')}: {alias!r} is an alias of {out[alias]!r} already")
            out[alias] = name
        t.done()
    return out


def _alerts(table: Table, names: tuple[str, ...]) -> tuple[float | None, ...]:
    """``[alerts] queue_wait_s = {P0 = 10, ...}``: per-class queue-wait alert thresholds."""
    waits = table.table("queue_wait_s")
    out = []
    for i, name in enumerate(names):
        default = DEFAULT_ALERT_WAIT_S[i] if i < len(DEFAULT_ALERT_WAIT_S) else None
        out.append(waits.float(name, default, positive=True, optional=True))
    waits.done()
    table.done()
    return tuple(out)


def _tiers(table: Table, names: tuple[str, ...]) -> dict[str, str | None]:
    out = dict(DEFAULT_SERVICE_TIERS)
    for tier in list(table.data):
        if tier not in DEFAULT_SERVICE_TIERS:  # OpenAI's values only: a typo never passes silently
            raise ConfigError(
                f"{table.key(tier)}: unknown service tier; OpenAI's are {', '.join(DEFAULT_SERVICE_TIERS)}"
            )
        value = table.raw(tier)
        if isinstance(value, str) and value.strip().lower() == "default":
            out[tier] = None
            continue
        out[tier] = names[rank(table, tier, names, None)]  # (a class as anywhere: "P1", "p1", 1)
    return out


def _origins(server: Table) -> tuple[str, ...]:
    value = server.list("allowed_origins", [])
    out = []
    for i, o in enumerate(value):
        if (
            not isinstance(o, str)
            or not (o == "*" or o.startswith(("http://", "https://")))
            or o.endswith("/")
        ):
            raise ConfigError(
                f"{server.key('allowed_origins')}[{i}]: an origin such as 'https://app.example.com' "
                f"(scheme and host, no path) or '*', got {o!r}"
            )
        out.append(o.lower())
    return tuple(out)
