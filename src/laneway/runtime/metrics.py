"""Prometheus metrics (``laneway_`` prefix, seconds and bytes, ``_total`` counters).

Each :class:`Metrics` has a registry of its own, so several servers can live
in one process (tests). Gauges that describe the present (queue depth, slots
busy, checkpoint bytes held, oldest wait) are read at scrape time through
:meth:`Metrics.refresh`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from laneway.core.decisions import REJECT_REASONS

# no "<name>_created" timestamp samples: they read as metrics of their own (a
# "laneway_checkpoint_bytes_created" that is a time, not bytes)
disable_created_metrics()

BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OUTCOMES = ("completed", "failed", "cancelled", "rejected")
BATCH_LINE_OUTCOMES = ("completed", "failed", "retried")


class Metrics:
    def __init__(self, class_names: Iterable[str], alert_thresholds: Mapping[str, float | None]) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.class_names = tuple(class_names)
        self.queue_depth = Gauge("laneway_queue_depth", "Requests queued, by class", ["class"], registry=r)
        self.running = Gauge("laneway_running_requests", "Requests running, by class", ["class"], registry=r)
        self.oldest_wait = Gauge(
            "laneway_queue_oldest_wait_seconds",
            "How long the longest-waiting queued request of each class has waited",
            ["class"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "laneway_queue_wait_seconds",
            "Time from arrival to first start (or to the end of a request that never started), by class",
            ["class"],
            buckets=BUCKETS_S,
            registry=r,
        )
        self.ttft = Histogram(
            "laneway_time_to_first_token_seconds",
            "Time from arrival to the first token, by class",
            ["class"],
            buckets=BUCKETS_S,
            registry=r,
        )
        self.latency = Histogram(
            "laneway_request_duration_seconds",
            "Time from arrival to the last token of completed requests, by class",
            ["class"],
            buckets=BUCKETS_S,
            registry=r,
        )
        self.requests = Counter(
            "laneway_requests_total", "Requests ended, by class and outcome", ["class", "outcome"], registry=r
        )
        # per tenant (the configured tenants: a bounded set; "" for requests of none)
        self.tenant_requests = Counter(
            "laneway_tenant_requests_total",
            "Requests ended, by tenant and outcome",
            ["tenant", "outcome"],
            registry=r,
        )
        self.tenant_rejections = Counter(
            "laneway_tenant_rejections_total",
            "Requests refused or dropped (quotas: rate_limited, concurrency; ...), by tenant and reason",
            ["tenant", "reason"],
            registry=r,
        )
        self.tenant_tokens = Counter(
            "laneway_tenant_tokens_total",
            "Tokens of the requests that completed, by tenant and kind (prompt, completion)",
            ["tenant", "kind"],
            registry=r,
        )
        self.lent_starts = Counter(
            "laneway_cluster_lent_starts_total",
            "Requests this replica started on slots the cluster's leader lent it (no round trip)",
            registry=r,
        )
        self.preemptions = Counter(
            "laneway_preemptions_total",
            "Preemptions, by class of the preempted request",
            ["class"],
            registry=r,
        )
        self.rejections = Counter(
            "laneway_rejections_total", "Requests refused or dropped by the scheduler, by reason", ["reason"],
            registry=r,
        )  # fmt: skip
        self.alerts = Counter(
            "laneway_queue_wait_alerts_total",
            "Requests that waited in the queue past their class's alert threshold",
            ["class"],
            registry=r,
        )
        self.alert_threshold = Gauge(
            "laneway_queue_wait_alert_threshold_seconds",
            "The queue-wait alert threshold of each class",
            ["class"],
            registry=r,
        )
        self.slots = Gauge("laneway_worker_slots", "Slots of each worker", ["worker"], registry=r)
        self.slots_busy = Gauge(
            "laneway_worker_slots_busy", "Busy slots of each worker", ["worker"], registry=r
        )
        self.worker_up = Gauge(
            "laneway_worker_up",
            "Whether each worker is in service (1), or taken out of placement (0): its probes "
            "fail (its engine is down, unreachable or stalled)",
            ["worker"],
            registry=r,
        )
        self.concurrency = Gauge(
            "laneway_worker_concurrency",
            "Requests each upstream worker is sent at once, adapted to its engine's own gauges "
            "(at most its slots)",
            ["worker"],
            registry=r,
        )
        self.prefix_hits = Gauge(
            "laneway_worker_prefix_hit_ratio_expected",
            "The share of the prompt blocks sent to each worker that placement expected its "
            "engine's prefix cache to hold",
            ["worker"],
            registry=r,
        )
        self.reported_hits = Gauge(
            "laneway_worker_prefix_hit_ratio_reported",
            "The share of the prompt tokens each worker's engine found in its prefix cache, by "
            "its own counters (vLLM's), since laneway first read them",
            ["worker"],
            registry=r,
        )
        self.checkpoint_bytes = Counter(
            "laneway_checkpoint_bytes_total", "Bytes of state saved by preemptions", registry=r
        )
        self.checkpoint_held = Gauge(
            "laneway_checkpoint_bytes_held", "Bytes of checkpoints held for preempted requests", registry=r
        )
        self.batch_lines = Counter(
            "laneway_batch_lines_total",
            "Batch lines that ended (completed, failed) or went back to wait for a retry (retried)",
            ["outcome"],
            registry=r,
        )
        self.batch_running = Gauge(
            "laneway_batch_lines_running", "Batch lines this server is running", registry=r
        )
        self.batches_active = Gauge("laneway_batches_active", "Batches this server is running", registry=r)
        # a fleet's GPUs and engines (absent without a [fleet])
        self.vram_used = Gauge(
            "laneway_gpu_vram_used_bytes",
            "VRAM of each declared GPU held by the replicas on it, loading or ready (their declared size)",
            ["gpu", "node"],
            registry=r,
        )
        self.vram_total = Gauge(
            "laneway_gpu_vram_bytes", "VRAM of each declared GPU", ["gpu", "node"], registry=r
        )
        self.replica_info = Gauge(
            "laneway_gpu_replica",
            "1 for each replica on each GPU, with its model and its engine's state "
            "(loading, ready, draining, asleep: holding no VRAM)",
            ["gpu", "replica", "model", "state"],
            registry=r,
        )
        self.model_load = Histogram(
            "laneway_model_load_seconds",
            "Time from starting a model's engine to its being ready",
            ["model"],
            buckets=BUCKETS_S,
            registry=r,
        )
        self.model_loads = Counter(
            "laneway_model_loads_total",
            "Engines started for a model because placement loaded it (not the preloads)",
            ["model"],
            registry=r,
        )
        self.model_wakes = Counter(
            "laneway_model_wakes_total",
            "Engines woken from their sleep mode for a model (a switch without a cold start)",
            ["model"],
            registry=r,
        )
        self.load_failures = Counter(
            "laneway_model_load_failures_total",
            "Engine launches that exited or were not ready in time",
            ["model"],
            registry=r,
        )
        self.adapter_loads = Counter(
            "laneway_adapter_loads_total",
            "LoRA adapters loaded into a running engine of their base, by outcome (loaded, failed)",
            ["adapter", "outcome"],
            registry=r,
        )
        self.adapter_unloads = Counter(
            "laneway_adapter_unloads_total",
            "LoRA adapters unloaded from an engine to make room for another",
            ["adapter"],
            registry=r,
        )
        # the children of every series, made once: every series shows up from the
        # first scrape, and the request path looks them up in a plain dict
        self.rejected = {reason: self.rejections.labels(reason) for reason in REJECT_REASONS}
        self.ended = {(n, o): self.requests.labels(n, o) for n in self.class_names for o in OUTCOMES}
        self.preempted = {n: self.preemptions.labels(n) for n in self.class_names}
        self.alerted = {n: self.alerts.labels(n) for n in self.class_names}
        self.waited = {n: self.queue_wait.labels(n) for n in self.class_names}
        self.first_token = {n: self.ttft.labels(n) for n in self.class_names}
        self.took = {n: self.latency.labels(n) for n in self.class_names}
        self.lines_ended = {o: self.batch_lines.labels(o) for o in BATCH_LINE_OUTCOMES}
        self._tenant_children: dict[tuple[int, str, str], Any] = {}  # (made as tenants show up)
        for name in self.class_names:
            limit = alert_thresholds.get(name)
            if limit is not None:
                self.alert_threshold.labels(name).set(limit)

    def set_concurrency(self, worker: str, n: int) -> None:
        self.concurrency.labels(worker).set(n)

    def set_reported_hits(self, worker: str, ratio: float) -> None:
        self.reported_hits.labels(worker).set(ratio)

    def count_rejection(self, reason: str, tenant: str | None = None) -> None:
        child = self.rejected.get(reason)
        if child is None:
            child = self.rejected[reason] = self.rejections.labels(reason)
        child.inc()
        self._tenant(self.tenant_rejections, tenant or "", reason).inc()

    def tenant_ended(self, tenant: str | None, outcome: str, tokens: tuple[int, int] | None) -> None:
        """A request of ``tenant`` ended so; ``tokens``: its usage (prompt, completion), if it
        completed."""
        name = tenant or ""
        self._tenant(self.tenant_requests, name, outcome).inc()
        if tokens is not None:
            self._tenant(self.tenant_tokens, name, "prompt").inc(tokens[0])
            self._tenant(self.tenant_tokens, name, "completion").inc(tokens[1])

    def _tenant(self, family: Counter, tenant: str, label: str) -> Any:
        """``family``'s child for (``tenant``, ``label``), made once (the request path then
        looks it up in a plain dict, as the other series' children)."""
        key = (id(family), tenant, label)
        child = self._tenant_children.get(key)
        if child is None:
            child = self._tenant_children[key] = family.labels(tenant, label)
        return child

    def refresh(
        self,
        queue_depth: Mapping[str, int],
        running: Mapping[str, int],
        oldest_wait: Mapping[str, float],
        slots: Mapping[str, tuple[int, int]],
        checkpoint_held: int,
        prefix_hits: Mapping[str, float] | None = None,
        down: Collection[str] = (),
    ) -> None:
        for name in self.class_names:
            self.queue_depth.labels(name).set(queue_depth.get(name, 0))
            self.running.labels(name).set(running.get(name, 0))
            self.oldest_wait.labels(name).set(oldest_wait.get(name, 0.0))
        for worker, (total, busy) in slots.items():
            self.slots.labels(worker).set(total)
            self.slots_busy.labels(worker).set(busy)
            self.worker_up.labels(worker).set(0 if worker in down else 1)
        self.checkpoint_held.set(checkpoint_held)
        for worker, ratio in (prefix_hits or {}).items():
            self.prefix_hits.labels(worker).set(ratio)

    def forget_worker(self, worker: str) -> None:
        """A worker left (a fleet's replica): its series go."""
        per_worker = (self.slots, self.slots_busy, self.worker_up, self.concurrency)
        for gauge in (*per_worker, self.prefix_hits, self.reported_hits):
            with contextlib.suppress(KeyError):  # (a series it never had)
                gauge.remove(worker)

    def refresh_fleet(
        self,
        gpus: Iterable[tuple[str, str, float, float]],
        replicas: Iterable[tuple[str, str, str, str]],
    ) -> None:
        """``gpus``: (id, node, used GB, total GB); ``replicas``: (gpu, replica, model, state)."""
        for gid, node, used, total in gpus:
            self.vram_used.labels(gid, node).set(used * 1e9)
            self.vram_total.labels(gid, node).set(total * 1e9)
        self.replica_info.clear()
        for labels in replicas:
            self.replica_info.labels(*labels).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)
