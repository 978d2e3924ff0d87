"""The tables ``laneway simulate`` prints: the figures of :mod:`laneway.sim.report` per
class, per policy, per tenant, of the wait estimates, per GPU and of rejections, each
split by columns where the terminal is too narrow for it (:func:`fit`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from laneway.sim.report import plural


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
    where = s.get("capacity") or plural(s["slots"], "slot")
    title = f"scenario {s['scenario']}: {plural(s['requests'], 'request')}, {where}"
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
    """One line per policy: preemptions, drains, model loads (and evictions and wakes on GPUs),
    utilization, makespan, estimate error."""
    gpus = any("gpu_utilization" in s for s in summaries)
    headers = ["policy", "preemptions", "drains", "expired", "loads"]
    headers += ["evictions", "wakes"] if gpus else []
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
            cells += [str(s.get("model_evictions", "-")), str(s.get("model_wakes", "-"))]
        err = s["estimate_error"]
        cells += [f"{s['utilization']:.1%}", fmt_s(s["makespan_s"]), fmt_errors(err)]
        table.add_row(*cells)
    return table


def fmt_errors(err: dict[str, Any]) -> str:
    if not err["waited"]:
        return "-"
    return f"{fmt_ratio(err['median'])} / {fmt_ratio(err['p90'])}"


TENANT_HEADERS = ("policy", "tenant", "count", "done", "wait mean s", "p50", "p99", "service s")
ESTIMATE_HEADERS = ("policy", "class", "waited", "error median", "p90", "in interval", "not known")


def tenant_rows(summaries: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Runs with several tenants: per policy and tenant, requests, waits, service received
    (:data:`TENANT_HEADERS`); the terminal's table and ``summary.md`` show these."""
    return [
        [
            s["policy"],
            name,
            str(f["count"]),
            str(f["completed"]),
            fmt_s(f["wait_mean_s"]),
            fmt_s(f["wait_p50_s"]),
            fmt_s(f["wait_p99_s"]),
            fmt_s(f["service_s"]),
        ]
        for s in summaries
        if "tenants" in s
        for name, f in s["tenants"].items()
    ]


def estimate_rows(summaries: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Wait-estimate errors per policy and class, of the requests that waited at least 1 s
    (:data:`ESTIMATE_HEADERS`); none when no request waited that long."""
    return [
        [
            s["policy"],
            name,
            str(f["estimate_error"]["waited"]),
            fmt_ratio(f["estimate_error"]["median"]),
            fmt_ratio(f["estimate_error"]["p90"]),
            fmt_coverage(f.get("estimate_range")),
            str(f["estimate_range"]["unknown"]) if f.get("estimate_range") else "—",
        ]
        for s in summaries
        for name, f in s["classes"].items()
        if f["estimate_error"]["waited"]
    ]


def _grouped(table: Table, rows: list[list[str]]) -> Table:
    """``rows`` in ``table``, a section per policy, the policy named on its first row."""
    last = None
    for row in rows:
        if last is not None and row[0] != last:
            table.add_section()
        table.add_row(row[0] if row[0] != last else "", *row[1:])
        last = row[0]
    return table


def render_tenants(summaries: Sequence[dict[str, Any]]) -> Table | None:
    rows = tenant_rows(summaries)
    if not rows:
        return None
    table = Table(title="Per tenant", title_justify="left")
    for header in TENANT_HEADERS:
        table.add_column(header, justify="left" if header in ("policy", "tenant") else "right")
    return _grouped(table, rows)


def render_estimates(summaries: Sequence[dict[str, Any]]) -> Table | None:
    rows = estimate_rows(summaries)
    if not rows:
        return None
    table = Table(
        title="Wait estimates: error of the requests that waited ≥ 1 s; interval (10th–90th "
        "percentile) held of all requests estimated",
        title_justify="left",
    )
    for header in ESTIMATE_HEADERS:
        table.add_column(header, justify="left" if header in ("policy", "class") else "right")
    return _grouped(table, rows)


def fmt_coverage(span: dict[str, Any] | None) -> str:
    """The share of waits inside their interval (of the bounded ones), e.g. ``81% of 120``."""
    if not span or not span["bounded"]:
        return "—"
    return f"{span['coverage']:.0%} of {span['bounded']}"


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


def render_prefix(summaries: Sequence[dict[str, Any]]) -> Table | None:
    """Upstreams with prefix caches: per policy, the prefix hit rate and each class's time
    to first token; ``None`` on other runs."""
    runs = [s for s in summaries if "prefix" in s]
    if not runs:
        return None
    table = Table(title="Upstreams with prefix caches: time to first token", title_justify="left")
    for header in ("policy", "prefix hit rate", "class", "count", "TTFT mean s", "p50", "p99"):
        table.add_column(header, justify="left" if header in ("policy", "class") else "right")
    for i, s in enumerate(runs):
        if i:
            table.add_section()
        for j, (name, f) in enumerate(s["prefix"]["ttft"].items()):
            table.add_row(
                s["policy"] if j == 0 else "",
                f"{s['prefix']['hit_rate']:.1%}" if j == 0 else "",
                name,
                str(f["count"]),
                fmt_s(f["mean_s"]),
                fmt_s(f["p50_s"]),
                fmt_s(f["p99_s"]),
            )
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
        (render_prefix(summaries), 2),
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
