"""The server's configuration as typed, frozen objects (built by :mod:`laneway.config.parse`).

Defaults describe ``laneway serve`` with no flags: one in-process worker
running ``builtin:smollm2`` (SmolLM2-135M-Instruct, prepared once into the cache)
with 4 slots on 127.0.0.1:8000, data in ``./.laneway``.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from laneway.config.fleet import FleetConfig
from laneway.core import SchedulerConfig, TenantPolicy

WORKER_TYPES = ("local", "simulated", "upstream")
TOKEN_ID_DIALECTS = ("vllm", "none")  # how an upstream gives token ids (vLLM and SGLang: "vllm")
DEFAULT_MODEL = "builtin:smollm2"
DEFAULT_ALERT_WAIT_S: tuple[float | None, ...] = (10.0, 60.0, 300.0, None)
# OpenAI's service_tier values -> class names (None: the tenant's default)
DEFAULT_SERVICE_TIERS: dict[str, str | None] = {
    "priority": "P0",
    "scale": "P1",
    "default": None,
    "auto": None,
    "flex": "P2",
}


def hash_key(key: str) -> str:
    """What the configuration stores for an API key: its SHA-256, hex."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class WorkerConfig:
    """One worker. ``model`` is what it loads (local: a spec or a directory;
    upstream: the model name the upstream serves); clients ask for ``served_name``."""

    name: str
    type: str = "local"
    model: str = DEFAULT_MODEL
    served_name: str = DEFAULT_MODEL
    slots: int = 4
    device: str | None = None  # local
    tokens_per_s: float | None = 50.0  # simulated
    first_token_s: float = 0.0  # simulated
    url: str | None = None  # upstream: base URL of an OpenAI-compatible server (…/v1)
    api_key_env: str | None = None  # upstream: environment variable holding its key
    timeout_s: float = 600.0  # upstream: the longest one run of a request may take
    stall_timeout_s: float | None = 30.0  # upstream: a run that receives nothing this long failed
    token_ids: str = "vllm"  # upstream: how it gives token ids ("vllm": vLLM, SGLang; "none")
    kv_tokens: int | None = None  # upstream: its engine's KV space in tokens (None: as it says)
    adapt_slots: bool = True  # upstream: its concurrency adapts to its engine's gauges (saturation)
    min_slots: int = 1  # upstream: ... never under this
    forward_priority: bool = False  # upstream: send each request's class as vLLM's `priority`
    isolate: bool = False  # urgent work runs there with no work it may preempt beside it
    options: Mapping[str, Any] = field(default_factory=dict)  # anything else, for the backend


@dataclass(frozen=True)
class TenantConfig:
    name: str
    key_hashes: frozenset[str]
    policy: TenantPolicy


@dataclass(frozen=True)
class BatchConfig:
    """``[batches]``: the Batch API's limits and how the runner feeds the scheduler."""

    default_priority: int = 2  # class of a batch whose metadata names none
    max_file_bytes: int = 200 << 20  # larger uploads are answered 413
    max_lines: int = 50_000  # a longer input file fails validation
    max_in_flight: int | None = None  # lines of one batch submitted at once; None: 2 × all slots, ≥ 8
    max_attempts: int = 5  # runs of one line (crashes and worker failures) before it fails
    lease_s: float = 60.0  # a claimed line is the runner's for this long, renewed while it lives
    poll_s: float = 1.0  # how often the runner looks for batches and status changes it was not told of


@dataclass(frozen=True)
class ClusterConfig:
    """``[cluster]``: replicas sharing state in Redis (absent: one process, nothing shared)."""

    redis_url: str  # redis://HOST:PORT/DB (or rediss://)
    replica: str  # this replica's name (default: host name and process id)
    key_prefix: str = "laneway:"  # every key laneway writes starts with it
    leader_priority: int = 1  # the live replica of the highest leads (ties: the first to try)
    # requests expected to take at most this long start on slots the leader lent this
    # replica, with no round trip (0: every request goes through the leader)
    lend_max_s: float = 0.5
    lend_reserve: int = 1  # slots of each worker never lent (for what the leader places)


# the server's scheduler defaults, where a bare SchedulerConfig (the simulator's) bounds
# nothing: a flood is shed with 503 + Retry-After rather than queued without end
SERVER_SCHEDULER = SchedulerConfig(max_queued_total=10_000, max_wait_s=120.0, hold_s=0.25)


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: Path = Path(".laneway")
    policy: str = "laneway"
    default_priority: int = 1  # class of a request that names none (no tenant default)
    max_body_bytes: int = 1 << 20
    default_max_tokens: int = 256
    # after the first SIGINT/SIGTERM, running requests get this long to finish (None: no limit)
    dashboard: bool = True  # GET /dashboard, a live page for operators
    ops_auth: bool = False  # /metrics and /dashboard need one of the tenants' keys
    # browser pages of other origins that may send POST/DELETE requests ("*": any); a
    # foreign origin's request is refused with 403 before it does anything
    allowed_origins: tuple[str, ...] = ()
    shutdown_grace_s: float | None = 30.0
    probe_interval_s: float = 2.0  # how often each worker's health is probed
    # how long a request waits for a worker of its model to come back while none is up (0: 503 at once)
    unavailable_hold_s: float = 3.0
    # connections (laneway.connections): a request's head and body must arrive in time, an
    # idle keep-alive connection is closed, and open connections are capped (None: from the
    # file-descriptor limit, which start-up raises to its maximum)
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    keep_alive_s: float = 5.0
    max_connections: int | None = None
    max_header_bytes: int = 64 << 10  # a request's line and headers; past it 431 and close
    # a stream whose worker dies goes on on another worker at most this often
    max_migrations: int = 2
    # bytes of clients' requests held (queued or running) past which new ones get 503
    max_queued_bytes: int = 256 << 20
    # where OpenTelemetry traces go (OTLP/HTTP, e.g. http://127.0.0.1:4318/v1/traces); None: none
    otlp_traces_endpoint: str | None = None
    workers: tuple[WorkerConfig, ...] = (WorkerConfig("w0"),)
    aliases: Mapping[str, str] = field(default_factory=dict)  # client model name -> served name
    scheduler: SchedulerConfig = field(default_factory=lambda: SERVER_SCHEDULER)
    tenants: tuple[TenantConfig, ...] = ()
    alert_wait_s: tuple[float | None, ...] = DEFAULT_ALERT_WAIT_S
    service_tiers: Mapping[str, str | None] = field(default_factory=lambda: dict(DEFAULT_SERVICE_TIERS))
    batches: BatchConfig = field(default_factory=BatchConfig)
    cluster: ClusterConfig | None = None
    fleet: FleetConfig | None = None  # GPUs and the engines this server starts on them (then no workers)

    @property
    def auth(self) -> bool:
        """Whether API keys are required (some tenant has a key)."""
        return any(t.key_hashes for t in self.tenants)

    @property
    def models(self) -> tuple[str, ...]:
        """The model names clients may ask for, in configuration order."""
        names = dict.fromkeys(w.served_name for w in self.workers)
        if self.fleet is not None:
            names.update(dict.fromkeys(self.fleet.inventory.models))
        return tuple(names)

    def tenant_for_key(self, key: str) -> TenantConfig | None:
        digest = hash_key(key)
        for t in self.tenants:
            if digest in t.key_hashes:
                return t
        return None
