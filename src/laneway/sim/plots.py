"""The ``--report DIR`` files: a Markdown summary and two PNG charts (three on GPUs).

- ``summary.md``: the figures of :mod:`laneway.sim.report` as Markdown tables
  (with its ``details``: rejection reasons), with the scenario, slots or GPU
  fleet, seed and the definitions of the figures;
- ``wait_cdf.png``: the wait-time CDF of completed requests, one panel per
  class, one line per policy;
- ``queue_depth.png``: queued requests per class over time, one panel per policy;
- ``gpu_timeline.png`` (runs on a GPU fleet only): per policy and GPU, which
  model ran when and for which class, model loads, preemptions and evictions
  (see :mod:`laneway.sim.gpu_plots`).

Charts are drawn on the Agg canvas directly (no pyplot, no display needed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from laneway.sim import report, tables
from laneway.sim.simulation import SimResult
from laneway.sim.tables import CLASS_COLUMNS, fmt_s

_EXTRA: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("wait_p95_s", "p95", fmt_s),
    ("expired", "expired", str),
)


def definitions() -> list[str]:
    """The bullet list under "Definitions:" in :mod:`laneway.sim.report`'s docstring."""
    doc = report.__doc__ or ""
    text = doc.split("Definitions:", 1)[-1].strip()
    items: list[str] = []
    for line in text.splitlines():
        if line.startswith("- "):
            items.append(line[2:].strip())
        elif line.strip() and items:
            items[-1] += " " + line.strip()
    return items


def _row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _section(title: str, headers: Sequence[str], rows: list[list[str]]) -> list[str]:
    """A table of ``rows`` under ``title`` (its first two columns text, the rest numbers);
    nothing without rows."""
    if not rows:
        return []
    rule = ["---", "---", *("---:" for _ in headers[2:])]
    return ["", f"## {title}", "", _row(headers), _row(rule), *(_row(row) for row in rows)]


def summary_markdown(summaries: Sequence[dict[str, Any]], description: str | None = None) -> str:
    first = summaries[0]
    lines = [f"# laneway simulation: {first['scenario']}", ""]
    if description:
        lines += [description, ""]
    seed = first["seed"] if first["seed"] is not None else "-"
    if "gpu_utilization" in first:
        fleet = [f"- fleet: {first['capacity']}"] if first.get("capacity") else []
        where = [*fleet, f"- GPUs: {', '.join(first['gpu_utilization'])}"]
    else:
        where = [f"- slots: {first['slots']}"]
    lines += [
        f"- requests: {first['requests']}",
        *where,
        f"- seed: {seed}",
        f"- policies: {', '.join(s['policy'] for s in summaries)}",
        "",
        "## Per class (seconds)",
        "",
    ]
    columns = [*CLASS_COLUMNS[:3], _EXTRA[1], *CLASS_COLUMNS[3:5], _EXTRA[0], *CLASS_COLUMNS[5:]]
    lines.append(_row(["policy", "class", *(header for _, header, _ in columns)]))
    lines.append(_row(["---", "---", *("---:" for _ in columns)]))
    for s in summaries:
        for name, figures in s["classes"].items():
            lines.append(_row([s["policy"], name, *(fmt(figures[key]) for key, _, fmt in columns)]))
    lines += ["", "## Per policy", ""]
    gpus = [s for s in summaries if "gpu_utilization" in s]
    headers = ["policy", "preemptions", "drains", "expired", "model loads"]
    headers += ["model evictions"] if gpus else []
    headers += ["utilization", "makespan s"]
    lines.append(_row([*headers, "estimate error (waited ≥ 1 s: median / p90)"]))
    lines.append(_row(["---", *("---:" for _ in headers)]))
    for s in summaries:
        cells = [s["policy"], s["preemptions"], s["drains"], s["expired"], s["model_loads"]]
        cells += [s.get("model_evictions", "-")] if gpus else []
        cells += [f"{s['utilization']:.1%}", fmt_s(s["makespan_s"]), tables.fmt_errors(s["estimate_error"])]
        lines.append(_row(cells))
    lines += _section(
        "Wait estimates of the requests that waited ≥ 1 s (interval: 10th–90th percentile)",
        tables.ESTIMATE_HEADERS,
        tables.estimate_rows(summaries),
    )
    lines += _section("Per tenant", tables.TENANT_HEADERS, tables.tenant_rows(summaries))
    if gpus:
        gpu_ids = list(gpus[0]["gpu_utilization"])
        lines += [
            "",
            "## GPU utilization",
            "",
            _row(["policy", *gpu_ids]),
            _row(["---", *("---:" for _ in gpu_ids)]),
        ]
        for s in gpus:
            lines.append(_row([s["policy"], *(f"{s['gpu_utilization'].get(g, 0.0):.1%}" for g in gpu_ids)]))
    cached = [s for s in summaries if "prefix" in s]
    if cached:
        lines += [
            "",
            "## Upstreams with prefix caches: time to first token (seconds)",
            "",
            _row(["policy", "prefix hit rate", "class", "count", "TTFT mean", "p50", "p99"]),
            _row(["---", "---:", "---", "---:", "---:", "---:", "---:"]),
        ]
        for s in cached:
            hit = f"{s['prefix']['hit_rate']:.1%}"
            for name, f in s["prefix"]["ttft"].items():
                cells = [f["count"], fmt_s(f["mean_s"]), fmt_s(f["p50_s"]), fmt_s(f["p99_s"])]
                lines.append(_row([s["policy"], hit, name, *cells]))
    rejected = tables.rejection_rows(summaries)
    if rejected:
        reasons = tables.reason_columns(summaries)
        lines += [
            "",
            "## Rejections by reason",
            "",
            _row(["policy", "class", *reasons]),
            _row(["---", "---", *("---:" for _ in reasons)]),
        ]
        lines += [_row([policy, name, *counts]) for policy, name, counts in rejected]
    lines += [
        "",
        "## Figures",
        "",
        "![wait-time CDF](wait_cdf.png)",
        "",
        "![queue depth](queue_depth.png)",
        "",
    ]
    if any("tenants" in s for s in summaries):
        lines += ["![wait-time CDF per tenant](tenant_waits.png)", ""]
    if gpus:
        lines += ["![GPU timeline](gpu_timeline.png)", ""]
    lines += ["## Definitions", "", *(f"- {item}" for item in definitions()), ""]
    return "\n".join(lines)


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110)
    return path


STYLES: tuple[Literal["-", "--", ":", "-."], ...] = (
    "-",
    "--",
    ":",
    "-.",
)  # line styles, so that curves that coincide stay visible


def twins(waits: dict[str, list[list[float]]]) -> dict[str, str]:
    """Policies whose waits are, class by class, those of a policy listed before them (their
    curves would hide under its): policy -> that policy."""
    out: dict[str, str] = {}
    order = list(waits)
    for i, policy in enumerate(order):
        for earlier in order[:i]:
            if earlier not in out and waits[earlier] == waits[policy]:
                out[policy] = earlier
                break
    return out


def _cdf_grid(panels: int) -> tuple[Figure, Any]:
    """A figure of ``panels`` wait-time CDFs, two a row, sharing their y axis."""
    ncols = min(2, panels)
    nrows = math.ceil(panels / ncols)
    fig = Figure(figsize=(6.0 * ncols, 3.6 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
    for ax in list(axes.flat)[panels:]:
        ax.set_visible(False)
    return fig, axes


def _cdf(ax: Any, xs: list[float], i: int, label: str, linewidth: float) -> None:
    """The CDF of the sorted waits ``xs``, in the ``i``-th colour and line style."""
    ys = [(k + 1) / len(xs) for k in range(len(xs))]
    ax.step(
        [0.0, *xs],
        [0.0, *ys],
        where="post",
        color=f"C{i % 10}",
        linestyle=STYLES[i % len(STYLES)],
        linewidth=linewidth,
        label=label,
    )


def _wait_axes(ax: Any, title: str) -> None:
    ax.set_xscale("symlog", linthresh=0.1, linscale=0.5)
    ax.set_xlim(0.0, max(ax.get_xlim()[1], 1.0))
    ax.set_ylim(0.0, 1.02)
    ax.set_title(title)
    ax.set_xlabel("wait (s; linear up to 0.1 s, log above)")
    ax.set_ylabel("fraction of completed")
    ax.grid(True, which="major", alpha=0.3)


def wait_cdf(results: Sequence[SimResult], path: Path) -> Path:
    names = results[0].scheduler.classes.names
    waits = {
        r.policy: [
            sorted(o.wait_s for o in r.outcomes if o.status == "finished" and o.spec.priority == c)
            for c in range(len(names))
        ]
        for r in results
    }
    shown = [c for c in range(len(names)) if any(w[c] for w in waits.values())] or [0]
    same = twins(waits)  # (they get their own line style, and the legend says whose they are)
    fig, axes = _cdf_grid(len(shown))
    for ax, c in zip(axes.flat, shown, strict=False):
        for i, (policy, per_class) in enumerate(waits.items()):
            if per_class[c]:
                _cdf(ax, per_class[c], i, policy, linewidth=2.2 - 0.3 * (i % 4))
        _wait_axes(ax, names[c])
    handles = [
        Line2D(
            [],
            [],
            color=f"C{i % 10}",
            linestyle=STYLES[i % len(STYLES)],
            label=f"{policy} (same as {same[policy]})" if policy in same else policy,
        )
        for i, policy in enumerate(waits)
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 5))
    fig.suptitle(f"Wait-time CDF, {results[0].scenario} (completed requests)")
    return _save(fig, path)


def tenants_of(results: Sequence[SimResult]) -> list[str]:
    """The tenants the runs' requests name (sorted); none for requests of no tenant."""
    return sorted({o.spec.tenant for r in results for o in r.outcomes if o.spec.tenant is not None})


def tenant_waits(results: Sequence[SimResult], path: Path) -> Path:
    """Per run (policy), each tenant's wait-time CDF: whether one tenant's flood makes
    another wait (token-fair tenants: it does not)."""
    tenants = tenants_of(results)
    fig, axes = _cdf_grid(len(results))
    for ax, r in zip(axes.flat, results, strict=False):
        for i, tenant in enumerate(tenants):
            xs = sorted(o.wait_s for o in r.outcomes if o.status == "finished" and o.spec.tenant == tenant)
            if xs:
                p50 = xs[len(xs) // 2]
                _cdf(ax, xs, i, f"{tenant} ({len(xs)} requests, wait p50 {p50:.1f} s)", linewidth=2.0)
        _wait_axes(ax, r.policy + ("" if r.scheduler.cfg.fair_tenants else " (no fair tenants)"))
        ax.legend(loc="upper left", fontsize="small")
    fig.suptitle(f"Wait-time CDF per tenant, {results[0].scenario}")
    return _save(fig, path)


def _time_unit(horizon_s: float) -> tuple[str, float]:
    if horizon_s > 3 * 3600:
        return "h", 3600.0
    if horizon_s > 600:
        return "min", 60.0
    return "s", 1.0


def horizon(result: SimResult) -> float:
    """When the last request ended (or arrived): the end of the charted time."""
    ends = [o.end_s for o in result.outcomes if math.isfinite(o.end_s)]
    ends += [o.spec.arrival_s for o in result.outcomes]
    return max([result.makespan_s, *ends])


def queue_depth(results: Sequence[SimResult], path: Path) -> Path:
    names = results[0].scheduler.classes.names
    used = sorted({o.spec.priority for r in results for o in r.outcomes}) or [0]
    end = max(horizon(r) for r in results)
    unit, scale = _time_unit(end)
    fig = Figure(figsize=(9.0, 2.4 + 2.0 * len(results)), layout="constrained")
    axes = fig.subplots(len(results), 1, squeeze=False, sharex=True, sharey=True)[:, 0]
    top = 1
    for ax, r in zip(axes, results, strict=True):
        samples = [(t, counts) for t, counts in r.depth if t <= end]
        ts = [t / scale for t, _ in samples]
        for c in used:
            ys = [counts[c] for _, counts in samples]
            top = max(top, *ys)
            ax.plot(ts, ys, drawstyle="steps-post", color=f"C{c % 10}", label=names[c])
        ax.set_title(r.policy, loc="left")
        ax.set_ylabel("queued")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize="small", ncols=len(used))
    axes[0].set_ylim(0, top * 1.08)
    axes[-1].set_xlabel(f"time ({unit})")
    axes[-1].set_xlim(0.0, end / scale)
    fig.suptitle(f"Queued requests per class, {results[0].scenario}")
    return _save(fig, path)


def write_report(
    results: Sequence[SimResult],
    summaries: Sequence[dict[str, Any]],
    out_dir: Path,
    description: str | None = None,
) -> list[Path]:
    """Write ``summary.md``, ``wait_cdf.png``, ``queue_depth.png``, for runs of several
    tenants ``tenant_waits.png``, and for runs on GPUs ``gpu_timeline.png``; return their paths."""
    if not results or len(results) != len(summaries):
        raise ValueError("write_report needs one summary per result, at least one")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / "summary.md"
    shown = [{**report.details(r), **s} for r, s in zip(results, summaries, strict=True)]
    md.write_text(summary_markdown(shown, description), encoding="utf-8")
    paths = [
        md,
        wait_cdf(results, out_dir / "wait_cdf.png"),
        queue_depth(results, out_dir / "queue_depth.png"),
    ]
    if len(tenants_of(results)) > 1:
        paths.append(tenant_waits(results, out_dir / "tenant_waits.png"))
    if any(r.gpus for r in results):
        from laneway.sim.gpu_plots import gpu_timeline  # it imports this module

        paths.append(gpu_timeline(results, out_dir / "gpu_timeline.png"))
    return paths
