"""Figures of one simulation run: the ``--json`` object of DESIGN §3 and a table.

:func:`summarize` turns a :class:`~laneway.sim.engine.SimResult` into a plain
dict (JSON-ready: no NaN, ``None`` where a figure does not exist).

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
- utilization: busy slot-seconds / (slots x makespan); makespan: time of the
  last completion (per class: of that class's last completion).
- estimate error: per completed request |estimate - first wait| / max(first
  wait, 1 s), where the estimate is the wait predicted at submission and the
  first wait runs from arrival to the first start; the median over requests
  (over every k-th request in runs of more than 200,000, see the engine).
- model loads: model swaps on workers; always 0 here (slot workers hold no models).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
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
    }


def estimate_errors(outcomes: Sequence[Outcome]) -> list[float]:
    """Relative errors of the submission-time wait estimates of completed requests."""
    out = []
    for o in outcomes:
        if o.status == "finished" and o.estimate_s == o.estimate_s:  # NaN: not sampled
            first = o.first_wait_s
            out.append(abs(o.estimate_s - first) / max(first, 1.0))
    return out


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
    capacity = result.slots * result.makespan_s
    errors = estimate_errors(result.outcomes)
    return {
        "policy": result.policy,
        "scenario": result.scenario,
        "slots": result.slots,
        "seed": result.seed,
        "requests": len(result.outcomes),
        "classes": classes,
        "preemptions": sum(counters.preemptions),
        "drains": counters.drains,
        "expired": sum(c["expired"] for c in classes.values()),
        "model_loads": 0,
        "utilization": result.busy_s / capacity if capacity > 0 else 0.0,
        "makespan_s": result.makespan_s,
        "estimate_error_median": statistics.median(errors) if errors else None,
    }


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
)


def _title(s: dict[str, Any]) -> str:
    slots = f"{s['slots']} slot" + ("" if s["slots"] == 1 else "s")
    title = f"scenario {s['scenario']}: {s['requests']} requests, {slots}"
    return title + (f", seed {s['seed']}" if s.get("seed") is not None else "")


def render_table(summaries: Sequence[dict[str, Any]]) -> Table:
    """Per policy and class: counts, wait mean/p50/p99/max and latency p99."""
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
    """One line per policy: preemptions, drains, utilization, makespan, estimate error."""
    table = Table()
    for header in ("policy", "preemptions", "drains", "expired", "utilization", "makespan s", "est. error"):
        table.add_column(header, justify="left" if header == "policy" else "right")
    for s in summaries:
        table.add_row(
            s["policy"],
            str(s["preemptions"]),
            str(s["drains"]),
            str(s["expired"]),
            f"{s['utilization']:.1%}",
            fmt_s(s["makespan_s"]),
            fmt_ratio(s["estimate_error_median"]),
        )
    return table


def print_summaries(summaries: Sequence[dict[str, Any]], console: Console) -> None:
    """The default ``laneway simulate`` output: the class table, then the totals."""
    console.print(render_table(summaries))
    console.print(render_totals(summaries))
