"""``gpu_timeline.png`` of ``--report DIR`` for runs on a GPU fleet.

One panel per policy, one row per GPU (configuration order, grouped by node,
the node named on the right). Inside a GPU's row, one lane per model that ran,
loaded or was evicted there; in a model's lane the upper half shows when
requests of the first class (P0) ran, solid, and the lower half when batch
classes ran, light. Overlapping runs are merged, so a panel draws a few dozen
bar collections however many runs there were. Model loads fill the whole lane,
grey and hatched; preemptions (red triangles) and evictions (black crosses)
are marked on the lane of the model they hit.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from laneway.sim.plots import _save, _time_unit, horizon
from laneway.sim.report import gpu_utilization, merge_intervals, model_evictions, model_wakes
from laneway.sim.simulation import SimResult

_ROW = 0.84  # share of a GPU row its lanes fill (the rest is a gap)
_LOAD: dict[str, Any] = {"facecolor": "0.88", "edgecolor": "0.35", "hatch": "////", "linewidth": 0.0}


def model_of(event: tuple[object, ...]) -> str:
    """The model a timeline entry is about (runs and loads carry an end time first)."""
    return str(event[4] if event[0] in ("run", "load") else event[3])


def gpu_nodes(result: SimResult) -> dict[str, str]:
    """GPU id -> node, from the placement's inventory (one unnamed node if unknown)."""
    planner = result.scheduler.planner
    inv = getattr(planner, "inv", None)
    nodes = {g.id: g.node for g in getattr(inv, "gpus", ())}
    return {gid: nodes.get(gid, "") for gid in result.gpus}


def model_order(results: Sequence[SimResult]) -> list[str]:
    """Models in inventory order (then in order of appearance): their colours."""
    names: list[str] = []
    for r in results:
        inv = getattr(r.scheduler.planner, "inv", None)
        names += [m for m in getattr(inv, "models", {}) if m not in names]
        for e in r.timeline:
            if model_of(e) not in names:
                names.append(model_of(e))
    return names


def _lanes(result: SimResult, models: list[str]) -> dict[tuple[str, str], tuple[float, float]]:
    """(GPU, model) -> (bottom, height) of the model's lane; GPU i's row spans i-0.5..i+0.5."""
    seen: dict[str, set[str]] = {gid: set() for gid in result.gpus}
    for e in result.timeline:
        for gid in e[1]:
            seen[gid].add(model_of(e))
    lanes = {}
    for i, gid in enumerate(result.gpus):
        here = [m for m in models if m in seen[gid]]
        height = _ROW / max(1, len(here))
        for k, m in enumerate(here):  # first model on top (y grows downwards)
            lanes[gid, m] = (i - _ROW / 2 + k * height, height)
    return lanes


def _panel(ax: Axes, r: SimResult, models: list[str], colors: dict[str, str], scale: float) -> None:
    lanes = _lanes(r, models)
    runs: dict[tuple[str, str, bool], list[tuple[float, float]]] = {}
    loads: dict[tuple[str, str], list[tuple[float, float]]] = {}
    marks: dict[str, list[tuple[float, float]]] = {"preempt": [], "evict": []}
    for e in r.timeline:
        kind, gids = e[0], e[1]
        for gid in gids:
            model = model_of(e)
            if kind == "run":
                runs.setdefault((gid, model, e[5] == 0), []).append((float(e[2]), float(e[3])))
            elif kind == "load":
                loads.setdefault((gid, model), []).append((float(e[2]), float(e[3])))
            else:
                bottom, height = lanes[gid, model]
                marks[str(kind)].append((float(e[2]) / scale, bottom + height / 2))
    for (gid, model, urgent), spans in runs.items():
        bottom, height = lanes[gid, model]
        bars = [(a / scale, (b - a) / scale) for a, b in merge_intervals(spans)]
        y = (bottom, height / 2) if urgent else (bottom + height / 2, height / 2)
        alpha = 1.0 if urgent else 0.4
        ax.broken_barh(bars, y, facecolors=colors[model], alpha=alpha, linewidth=0)
    for (gid, model), spans in loads.items():
        bottom, height = lanes[gid, model]
        bars = [(a / scale, (b - a) / scale) for a, b in merge_intervals(spans)]
        ax.broken_barh(bars, (bottom, height), **_LOAD)
    styles: tuple[tuple[str, dict[str, Any]], ...] = (
        ("preempt", {"marker": "v", "color": "red"}),
        ("evict", {"marker": "x", "color": "k"}),
    )
    for kind, style in styles:
        if marks[kind]:
            xs, ys = zip(*marks[kind], strict=True)
            ax.scatter(xs, ys, s=10, linewidths=0.8, zorder=3, **style)


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _node_axis(ax: Axes, nodes: dict[str, str], gpus: list[str]) -> None:
    """GPU ids on the left; node names on the right, a line between nodes."""
    ax.set_yticks(range(len(gpus)), gpus)
    groups: dict[str, list[int]] = {}
    for i, gid in enumerate(gpus):
        groups.setdefault(nodes[gid], []).append(i)
    right = ax.twinx()
    right.set_ylim(ax.get_ylim())
    right.set_yticks(
        [sum(rows) / len(rows) for rows in groups.values()],
        [f"node {n}" if n else "" for n in groups],
        rotation=90,
        va="center",
    )
    right.tick_params(length=0)
    for rows in list(groups.values())[1:]:
        ax.axhline(rows[0] - 0.5, color="0.4", linewidth=0.8)


def gpu_timeline(results: Sequence[SimResult], path: Path) -> Path:
    """Per policy and GPU: which model ran when, for which class; loads, preemptions."""
    gpu_runs = [r for r in results if r.gpus]
    models = model_order(gpu_runs)
    colors = {m: f"C{i % 10}" for i, m in enumerate(models)}
    end = max(max([horizon(r), *(float(e[3]) for e in r.timeline if e[0] == "load")]) for r in gpu_runs)
    unit, scale = _time_unit(end)
    rows = max(len(r.gpus) for r in gpu_runs)
    fig = Figure(figsize=(12.0, 1.4 + len(gpu_runs) * (0.9 + 0.42 * rows)), layout="constrained")
    axes = fig.subplots(len(gpu_runs), 1, squeeze=False, sharex=True)[:, 0]
    for ax, r in zip(axes, gpu_runs, strict=True):
        _panel(ax, r, models, colors, scale)
        ax.set_ylim(len(r.gpus) - 0.5, -0.5)  # first GPU on top
        _node_axis(ax, gpu_nodes(r), r.gpus)
        per_gpu = gpu_utilization(r)
        util = sum(per_gpu.values()) / len(per_gpu) if per_gpu else 0.0
        loads = r.scheduler.counters.model_loads
        preemptions = sum(r.scheduler.counters.preemptions)
        wakes = model_wakes(r)
        title = f"{r.policy}: utilization {util:.1%}, {_n(loads, 'load')}, "
        title += f"{_n(wakes, 'wake')}, " if wakes else ""
        title += f"{_n(model_evictions(r), 'eviction')}, "
        ax.set_title(title + _n(preemptions, "preemption"), loc="left")
        ax.set_ylabel("GPU")
        ax.grid(True, axis="x", alpha=0.3)
    axes[-1].set_xlim(0.0, end / scale)
    axes[-1].set_xlabel(f"time ({unit})")
    names = gpu_runs[0].scheduler.classes.names
    batch = f"{names[1]}–{names[-1]}" if len(names) > 2 else names[-1]
    handles: list[Patch | Line2D] = [Patch(color=colors[m], label=m) for m in models]
    handles += [
        Patch(color="0.3", label=f"{names[0]} (upper half)"),
        Patch(color="0.3", alpha=0.4, label=f"{batch} batch (lower half)"),
        Patch(label="model load", **_LOAD),
        Line2D([], [], linestyle="", marker="v", color="red", label="preemption"),
        Line2D([], [], linestyle="", marker="x", color="k", label="eviction"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 8), fontsize="small")
    fig.suptitle(f"GPU timeline, {gpu_runs[0].scenario}: one lane per model on each GPU")
    return _save(fig, path)
