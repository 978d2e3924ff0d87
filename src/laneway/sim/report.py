"""Figures of one simulation run: the ``--json`` object of DESIGN §3 and a table.

:func:`summarize` turns a :class:`~laneway.sim.engine.SimResult` into a plain
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
  counted); 0 on slots (slot workers hold no models). model evictions (GPU
  runs only): loaded replicas removed to make room for others.
- rejection reasons: why the rejected requests did not complete, per class:
  queue_timeout (the expired), unplaceable (no GPU group could ever hold its
  model, or the fleet does not serve it), queue_full, shed, overloaded,
  rate_limited, concurrency, not_entitled; unfinished: still queued when the
  run ended.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from laneway.sim.engine import Outcome, SimResult


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
        "service_s": sum(o.spec.duration_s or 0.0 for o in done),
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
            start, end = float(event[2]), float(event[3])  # type: ignore[arg-type]
            for gid in event[1]:  # type: ignore[union-attr]
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
    planner = getattr(result.scheduler, "_planner", None)
    count = getattr(planner, "evictions", None)
    if isinstance(count, int):
        return count
    return sum(1 for event in result.timeline if event[0] == "evict")


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
    return summary


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def capacity(result: SimResult) -> str:
    """``4 slots``, or on a GPU fleet ``8 GPUs in 2 nodes, 3 models``."""
    inv = result.inventory
    if inv is None:
        return _n(result.slots, "slot")
    return f"{_n(len(inv.gpus), 'GPU')} in {_n(len(inv.nodes), 'node')}, {_n(len(inv.models), 'model')}"


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


def fmt_s(value: float | None) -> str:
    """Seconds for a table cell: fewer decimals as the value grows."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.2f}"
    if value < 1000:
        return f"{value:.1f}"
    return f"{value:,.0f}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


CLASS_COLUMNS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("count", "count", str),
    ("completed", "done", str),
    ("rejected", "rejected", str),
    ("wait_mean_s", "wait mean s", fmt_s),
    ("wait_p50_s", "p50", fmt_s),
    ("wait_p99_s", "p99", fmt_s),
    ("wait_max_s", "max", fmt_s),
    ("latency_p99_s", "latency p99 s", fmt_s),
    ("makespan_s", "last done s", fmt_s),
)


def _title(s: dict[str, Any]) -> str:
    where = s.get("capacity") or _n(s["slots"], "slot")
    title = f"scenario {s['scenario']}: {_n(s['requests'], 'request')}, {where}"
    return title + (f", seed {s['seed']}" if s.get("seed") is not None else "")


def reason_columns(summaries: Sequence[dict[str, Any]]) -> list[str]:
    """The rejection reasons of any of the summaries (with :func:`details` merged in)."""
    found = {r for s in summaries for reasons in s.get("rejections", {}).values() for r in reasons}
    return sorted(found)


def rejection_rows(summaries: Sequence[dict[str, Any]]) -> list[tuple[str, str, list[int]]]:
    """(policy, class, count per reason of :func:`reason_columns`) for each class with rejections."""
    reasons = reason_columns(summaries)
    rows = []
    for s in summaries:
        for name, counts in s.get("rejections", {}).items():
            rows.append((s["policy"], name, [counts.get(r, 0) for r in reasons]))
    return rows


def render_table(summaries: Sequence[dict[str, Any]]) -> Table:
    """Per policy and class: counts, wait mean/p50/p99/max, latency p99 and last completion."""
    table = Table(title=_title(summaries[0]) if summaries else None, title_justify="left")
    table.add_column("policy", style="bold")
    table.add_column("class")
    for _, header, _ in CLASS_COLUMNS:
        table.add_column(header, justify="right")
    for i, s in enumerate(summaries):
        if i:
            table.add_section()
        for j, (name, figures) in enumerate(s["classes"].items()):
            cells = [fmt(figures[key]) for key, _, fmt in CLASS_COLUMNS]
            table.add_row(s["policy"] if j == 0 else "", name, *cells)
    return table


def render_totals(summaries: Sequence[dict[str, Any]]) -> Table:
    """One line per policy: preemptions, drains, model loads (and evictions on GPUs),
    utilization, makespan, estimate error."""
    gpus = any("gpu_utilization" in s for s in summaries)
    headers = ["policy", "preemptions", "drains", "expired", "loads"]
    headers += ["evictions"] if gpus else []
    headers += ["utilization", "makespan s", "est. error"]  # (the waited ones: med / p90)
    table = Table()
    for header in headers:
        table.add_column(header, justify="left" if header == "policy" else "right")
    for s in summaries:
        cells = [
            s["policy"],
            str(s["preemptions"]),
            str(s["drains"]),
            str(s["expired"]),
            str(s["model_loads"]),
        ]
        if gpus:
            cells.append(str(s.get("model_evictions", "-")))
        err = s["estimate_error"]
        cells += [f"{s['utilization']:.1%}", fmt_s(s["makespan_s"]), fmt_errors(err)]
        table.add_row(*cells)
    return table


def fmt_errors(err: dict[str, Any]) -> str:
    if not err["waited"]:
        return "-"
    return f"{fmt_ratio(err['median'])} / {fmt_ratio(err['p90'])}"


def render_tenants(summaries: Sequence[dict[str, Any]]) -> Table | None:
    """Runs with several tenants: per policy and tenant, requests, waits, service received."""
    runs = [s for s in summaries if "tenants" in s]
    if not runs:
        return None
    table = Table(title="Per tenant", title_justify="left")
    for header in ("policy", "tenant", "count", "done", "wait mean s", "p50", "p99", "service s"):
        table.add_column(header, justify="left" if header in ("policy", "tenant") else "right")
    for i, s in enumerate(runs):
        if i:
            table.add_section()
        for j, (name, f) in enumerate(s["tenants"].items()):
            table.add_row(
                s["policy"] if j == 0 else "",
                name,
                str(f["count"]),
                str(f["completed"]),
                fmt_s(f["wait_mean_s"]),
                fmt_s(f["wait_p50_s"]),
                fmt_s(f["wait_p99_s"]),
                fmt_s(f["service_s"]),
            )
    return table


def render_estimates(summaries: Sequence[dict[str, Any]]) -> Table | None:
    """Wait-estimate errors per policy and class, of the requests that waited at least 1 s;
    ``None`` when no request waited that long."""
    rows = [
        (s["policy"], name, f["estimate_error"])
        for s in summaries
        for name, f in s["classes"].items()
        if f["estimate_error"]["waited"]
    ]
    if not rows:
        return None
    table = Table(title="Wait estimates of the requests that waited ≥ 1 s", title_justify="left")
    for header in ("policy", "class", "waited", "error median", "p90"):
        table.add_column(header, justify="left" if header in ("policy", "class") else "right")
    last = None
    for policy, name, err in rows:
        if last is not None and policy != last:
            table.add_section()
        table.add_row(
            policy if policy != last else "",
            name,
            str(err["waited"]),
            fmt_ratio(err["median"]),
            fmt_ratio(err["p90"]),
        )
        last = policy
    return table


def render_gpus(summaries: Sequence[dict[str, Any]]) -> Table | None:
    """GPU runs: one line per policy, the utilization of each GPU; ``None`` on slots."""
    gpu_runs = [s for s in summaries if "gpu_utilization" in s]
    if not gpu_runs:
        return None
    gpu_ids = list(gpu_runs[0]["gpu_utilization"])
    table = Table(title="GPU utilization", title_justify="left")
    table.add_column("policy")
    for gid in gpu_ids:
        table.add_column(gid, justify="right")
    for s in gpu_runs:
        per_gpu = s["gpu_utilization"]
        table.add_row(s["policy"], *(f"{per_gpu[g]:.1%}" if g in per_gpu else "-" for g in gpu_ids))
    return table


def render_rejections(summaries: Sequence[dict[str, Any]]) -> Table | None:
    """Rejected requests by reason, one line per policy and class that had any;
    ``None`` when nothing was rejected (or the summaries carry no :func:`details`)."""
    rows = rejection_rows(summaries)
    if not rows:
        return None
    table = Table(title="Rejections by reason", title_justify="left")
    table.add_column("policy", style="bold")
    table.add_column("class")
    for reason in reason_columns(summaries):
        table.add_column(reason, justify="right")
    last = None
    for policy, name, counts in rows:
        if last is not None and policy != last:
            table.add_section()
        table.add_row(policy if policy != last else "", name, *(str(c) for c in counts))
        last = policy
    return table


def print_summaries(summaries: Sequence[dict[str, Any]], console: Console) -> None:
    """The default ``laneway simulate`` output: the class table, the totals, per-GPU
    utilization, the rejection reasons (summaries with :func:`details` merged in)."""
    tables = [(render_table(summaries), 2), (render_totals(summaries), 1), (render_tenants(summaries), 2)]
    tables += [
        (render_estimates(summaries), 2),
        (render_gpus(summaries), 1),
        (render_rejections(summaries), 2),
    ]
    for table, keys in tables:
        if table is not None:
            for part in fit(table, console, keys):
                console.print(part)


def fit(table: Table, console: Console, keys: int = 1) -> list[Table]:
    """``table`` where it fits the console; else split by columns into tables that do, each
    repeating the first ``keys`` columns (policy, class): no figure is ever cut (an
    80-column terminal showed ``267…``)."""

    def width(col: Any) -> int:  # a column with its cells on one line, padding and border
        return 3 + max([len(str(col.header)), *(len(str(c)) for c in col.cells)])

    cols = list(table.columns)
    if 1 + sum(width(c) for c in cols) <= console.width or len(cols) <= keys + 1:
        return [table]
    fixed = 1 + sum(width(c) for c in cols[:keys])
    parts: list[list[Any]] = [[]]
    used = fixed
    for col in cols[keys:]:
        if parts[-1] and used + width(col) > console.width:
            parts.append([])
            used = fixed
        parts[-1].append(col)
        used += width(col)
    rows = [list(col.cells) for col in cols]
    out = []
    for n, part in enumerate(parts):
        t = Table(title=table.title if n == 0 else None, title_justify=table.title_justify)
        for col in [*cols[:keys], *part]:
            t.add_column(col.header, justify=col.justify, style=col.style, no_wrap=True)
        picked = [cols.index(c) for c in [*cols[:keys], *part]]
        for r, row in enumerate(table.rows):
            t.add_row(*(rows[k][r] for k in picked), end_section=row.end_section)
        out.append(t)
    return out
