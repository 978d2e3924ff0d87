"""Figures of one simulation run: the ``--json`` object (the tables that show them:
:mod:`laneway.sim.tables`).

:func:`summarize` turns a :class:`~laneway.sim.simulation.SimResult` into a plain
dict (JSON-ready: no NaN, ``None`` where a figure does not exist);
:func:`details` adds what the tables and ``summary.md`` show beyond the
``--json`` object: the capacity in words and the rejection reasons.

Definitions:

- count: requests of the class in the workload; completed: those that finished;
  rejected: every request that did not complete (refused at admission, shed,
  or expired); expired: those of the rejected that hit their queue timeout.
- wait: total time a completed request spent queued, first wait plus the waits
  after each preemption; latency: end minus arrival of a completed request.
- percentiles (p50, p95, p99): nearest-rank method, the smallest sample with
  at least p% of the samples at or below it; classes with no completed request
  show null figures.
- preemptions: running requests stopped for more urgent work (per class: the
  victims of that class); drains: slots claimed by waiting for a victim to end.
- utilization: on slots, busy slot-seconds / (slots x makespan); on GPUs, the
  mean over GPUs of each GPU's busy fraction of [0, makespan], a GPU being busy
  while any request runs on it or any model loads onto it (the union of those
  intervals: concurrent requests on one replica, or replicas sharing a GPU,
  count once; a run over 4 GPUs keeps each of them busy; a preempted run counts
  until its KV cache is saved); per GPU in ``gpu_utilization`` (GPU runs only).
  makespan: time of the last completion (per class, "last done": of that
  class's last completion).
- estimate error: per completed request that waited at least 1 s before it
  first started, |estimate - first wait| / first wait, where the estimate is
  the wait predicted at submission; the median and p90 per class and over all
  (of every k-th request in runs of more than 200,000, see the engine).
  Requests that never waited are left out: on a trace where most start at
  once they would make any estimator look right. (``estimate_error_median``
  in ``--json`` is the older figure over every completed request, with
  max(first wait, 1 s) below the line.)
- model loads: model loads started on GPUs (models preloaded at start-up not
  counted; nor wakes); 0 on slots (slot workers hold no models). model evictions (GPU
  runs only): loaded replicas removed to make room for others, stopped or, for a model
  with a sleep mode (``wake_s``), put to sleep; model wakes (GPU runs only): replicas
  woken where they slept.
- prefix (upstreams with prefix caches only): ``hit_rate``, the share of all prompt
  tokens their engines found cached; ``ttft`` per class: count, mean, p50 and p99 of
  the time from arrival to first token (the wait in laneway's queue, then in the
  engine's prefill queue, then the prefill of the uncached tokens).
- rejection reasons: why the rejected requests did not complete, per class:
  queue_timeout (the expired), unplaceable (no GPU group could ever hold its
  model, or the fleet does not serve it), queue_full, shed, overloaded,
  rate_limited, concurrency, not_entitled; unfinished: still queued when the
  run ended.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from laneway.sim.simulation import Outcome, SimResult


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of ``values`` (``p`` in 0–100); ``None`` if empty."""
    if not values:
        return None
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within 0–100, got {p}")
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def _class_figures(outs: list[Outcome], preemptions: int) -> dict[str, Any]:
    done = [o for o in outs if o.status == "finished"]
    waits = [o.wait_s for o in done]
    latencies = [o.latency_s for o in done]
    return {
        "count": len(outs),
        "completed": len(done),
        "rejected": len(outs) - len(done),
        "expired": sum(1 for o in outs if o.status == "expired"),
        "wait_mean_s": statistics.fmean(waits) if waits else None,
        "wait_p50_s": percentile(waits, 50),
        "wait_p95_s": percentile(waits, 95),
        "wait_p99_s": percentile(waits, 99),
        "wait_max_s": max(waits) if waits else None,
        "latency_p99_s": percentile(latencies, 99),
        "makespan_s": max((o.end_s for o in done), default=None),
        "preemptions": preemptions,
        "estimate_error": error_figures(waited_errors(outs)),
        "estimate_range": range_figures(outs),
    }


def range_figures(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """How the submission-time intervals held, over the completed requests estimated: how
    many had a bounded interval, the share of those whose wait fell in it (``coverage``:
    0.8 is the aim of a 10th-90th percentile interval; ``coverage_waited``: the same of
    those that waited at least :data:`WAITED_S`, which an interval does not aim at), and
    how many were told the wait was not known (no upper bound)."""
    bounded = inside = unknown = waited = inside_waited = 0
    for o in outcomes:
        r = o.estimate_range
        if o.status != "finished" or r is None:
            continue
        if math.isinf(r.high_s):
            unknown += 1
            continue
        hit = r.low_s - 1e-9 <= o.first_wait_s <= r.high_s + 1e-9
        bounded += 1
        inside += hit
        if o.first_wait_s >= WAITED_S:
            waited += 1
            inside_waited += hit
    return {
        "bounded": bounded,
        "coverage": inside / bounded if bounded else None,
        "coverage_waited": inside_waited / waited if waited else None,
        "unknown": unknown,
    }


def _tenant_figures(outs: list[Outcome]) -> dict[str, Any]:
    done = [o for o in outs if o.status == "finished"]
    waits = [o.wait_s for o in done]
    return {
        "count": len(outs),
        "completed": len(done),
        "wait_mean_s": statistics.fmean(waits) if waits else None,
        "wait_p50_s": percentile(waits, 50),
        "wait_p99_s": percentile(waits, 99),
        # the slot time its requests held (not their given durations only: a request sized
        # by its tokens has none), stops and restores included
        "service_s": sum(o.latency_s - o.wait_s for o in done),
    }


WAITED_S = 1.0  # the estimate error counts requests that waited at least this long


def waited_errors(outcomes: Sequence[Outcome]) -> list[float]:
    """Relative errors of the submission-time wait estimates of the completed requests
    that waited at least :data:`WAITED_S` before their first start."""
    out = []
    for o in outcomes:
        if o.status == "finished" and o.estimate_s == o.estimate_s:  # NaN: not sampled
            first = o.first_wait_s
            if first >= WAITED_S:
                out.append(abs(o.estimate_s - first) / first)
    return out


def error_figures(errors: Sequence[float]) -> dict[str, Any]:
    return {"waited": len(errors), "median": percentile(errors, 50), "p90": percentile(errors, 90)}


def estimate_errors(outcomes: Sequence[Outcome]) -> list[float]:
    """Relative errors of the submission-time wait estimates of completed requests."""
    out = []
    for o in outcomes:
        if o.status == "finished" and o.estimate_s == o.estimate_s:  # NaN: not sampled
            first = o.first_wait_s
            out.append(abs(o.estimate_s - first) / max(first, 1.0))
    return out


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals as sorted, disjoint intervals."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def gpu_busy_intervals(result: SimResult) -> dict[str, list[tuple[float, float]]]:
    """Per GPU (configuration order): when a run or a model load covered it, merged."""
    spans: dict[str, list[tuple[float, float]]] = {gid: [] for gid in result.gpus}
    for event in result.timeline:
        if event[0] in ("run", "load"):
            start, end = float(event[2]), float(event[3])
            gpus: tuple[str, ...] = event[1]
            for gid in gpus:
                spans[gid].append((start, end))
    return {gid: merge_intervals(v) for gid, v in spans.items()}


def gpu_utilization(result: SimResult) -> dict[str, float]:
    """Per GPU: the busy fraction of [0, makespan] (see the definitions above)."""
    horizon = result.makespan_s
    out: dict[str, float] = {}
    for gid, spans in gpu_busy_intervals(result).items():
        busy = sum(max(0.0, min(end, horizon) - max(start, 0.0)) for start, end in spans)
        out[gid] = busy / horizon if horizon > 0 else 0.0
    return out


def model_evictions(result: SimResult) -> int:
    """Replicas evicted in a GPU run (the placement's count, else the timeline's)."""
    planner = result.scheduler.planner
    count = getattr(planner, "evictions", None)
    if isinstance(count, int):
        return count
    return sum(1 for event in result.timeline if event[0] == "evict")


def model_wakes(result: SimResult) -> int:
    """Replicas woken where they slept in a GPU run (none where no model sleeps)."""
    count = getattr(result.scheduler.planner, "wakes", 0)
    return count if isinstance(count, int) else 0


def summarize(result: SimResult) -> dict[str, Any]:
    """The DESIGN §3 ``--json`` object for one run, plus a few extra keys."""
    names = result.scheduler.classes.names
    counters = result.scheduler.counters
    by_class: list[list[Outcome]] = [[] for _ in names]
    for o in result.outcomes:
        by_class[o.spec.priority].append(o)
    classes = {
        name: _class_figures(by_class[rank], counters.preemptions[rank]) for rank, name in enumerate(names)
    }
    errors = estimate_errors(result.outcomes)
    if result.gpus:
        per_gpu = gpu_utilization(result)
        utilization = statistics.fmean(per_gpu.values())
    else:
        capacity = result.slots * result.makespan_s
        utilization = result.busy_s / capacity if capacity > 0 else 0.0
    summary: dict[str, Any] = {
        "policy": result.policy,
        "scenario": result.scenario,
        "slots": result.slots,
        "seed": result.seed,
        "requests": len(result.outcomes),
        "classes": classes,
        "preemptions": sum(counters.preemptions),
        "drains": counters.drains,
        "expired": sum(c["expired"] for c in classes.values()),
        "model_loads": counters.model_loads,
        "utilization": utilization,
        "makespan_s": result.makespan_s,
        "estimate_error_median": statistics.median(errors) if errors else None,
        "estimate_error": error_figures(waited_errors(result.outcomes)),
    }
    tenants: dict[str, list[Outcome]] = {}
    for o in result.outcomes:
        if o.spec.tenant is not None:
            tenants.setdefault(o.spec.tenant, []).append(o)
    if len(tenants) > 1:
        summary["tenants"] = {name: _tenant_figures(outs) for name, outs in sorted(tenants.items())}
    if result.gpus:
        summary["gpu_utilization"] = per_gpu
        summary["model_evictions"] = model_evictions(result)
        summary["model_wakes"] = model_wakes(result)
    if result.engines is not None:
        summary["prefix"] = prefix_figures(result, by_class)
    return summary


def prefix_figures(result: SimResult, by_class: list[list[Outcome]]) -> dict[str, Any]:
    """Upstreams with prefix caches: the share of prompt tokens found cached, and per
    class the time to first token (queue, the engine's prefill queue, the prefill)."""
    assert result.engines is not None
    names = result.scheduler.classes.names
    ttft: dict[str, Any] = {}
    for rank, outs in enumerate(by_class):
        firsts = [o.ttft_s for o in outs if not math.isnan(o.ttft_s)]
        if firsts:
            ttft[names[rank]] = {
                "count": len(firsts),
                "mean_s": statistics.fmean(firsts),
                "p50_s": percentile(firsts, 50),
                "p99_s": percentile(firsts, 99),
            }
    return {"hit_rate": result.engines.hit_rate(), "ttft": ttft}


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def capacity(result: SimResult) -> str:
    """``4 slots``, or on a GPU fleet ``8 GPUs in 2 nodes, 3 models``."""
    inv = result.inventory
    if inv is None:
        return plural(result.slots, "slot")
    gpus, nodes, models = (
        plural(len(inv.gpus), "GPU"),
        plural(len(inv.nodes), "node"),
        plural(len(inv.models), "model"),
    )
    return f"{gpus} in {nodes}, {models}"


def rejection_reasons(result: SimResult) -> dict[str, dict[str, int]]:
    """Per class with rejected requests: how many were rejected for each reason."""
    names = result.scheduler.classes.names
    out: dict[str, dict[str, int]] = {}
    for o in result.outcomes:
        if o.status != "finished":
            reasons = out.setdefault(names[o.spec.priority], {})
            reason = o.reason or "unfinished"
            reasons[reason] = reasons.get(reason, 0) + 1
    return {name: dict(sorted(out[name].items())) for name in names if name in out}


def details(result: SimResult) -> dict[str, Any]:
    """Figures the table and ``summary.md`` show that the ``--json`` object leaves
    out: ``capacity`` (words) and ``rejections`` ({class: {reason: count}})."""
    return {"capacity": capacity(result), "rejections": rejection_reasons(result)}
