"""What a live fleet shows: each replica's state and process (``/readyz``), each GPU's VRAM
and replicas (the dashboard), and the same as Prometheus gauges (``/metrics``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from laneway.runtime.fleet import Fleet


def state(fleet: Fleet, rid: str) -> str:
    """A replica's engine: loading, ready, draining or asleep."""
    planner = fleet.planner
    if rid in planner.asleep:
        return "asleep"
    if rid not in fleet.rt.workers:
        return "loading"
    return "draining" if planner.replicas[rid].draining > fleet.rt.now() else "ready"


def replicas(fleet: Fleet) -> dict[str, dict[str, object]]:
    """Per replica: its model, GPUs, state and process."""
    planner = fleet.planner
    out: dict[str, dict[str, object]] = {}
    for rid, r in [*planner.replicas.items(), *planner.asleep.items()]:
        engine = fleet.engines.get(rid) or fleet.sleeping.get(rid)
        out[rid] = {
            "model": r.model.name,
            "gpus": list(r.gpus),
            "state": state(fleet, rid),
            "pid": None if engine is None else engine.pid,
            "url": None if engine is None else engine.url,
            "adapters": sorted(planner.resident.get(rid, ())),  # (LoRA adapters loaded into it)
        }
    return out


def _on(fleet: Fleet, gid: str) -> list[tuple[str, str]]:
    """(replica, model) of every replica on GPU ``gid``: loading, ready or asleep."""
    planner = fleet.planner
    here = [(rid, r.model.name) for rid, r in planner.on_gpu[gid].items()]
    return here + [(rid, r.model.name) for rid, r in planner.asleep.items() if gid in r.gpus]


def gpus(fleet: Fleet) -> list[dict[str, object]]:
    """Per GPU: its VRAM used of total, and the replicas on it (with the adapters they hold)."""
    planner = fleet.planner
    held = planner.resident
    return [
        {
            "id": g.id,
            "node": g.node,
            "vram_used_gb": round(planner.used[g.id], 3),
            "vram_total_gb": g.vram_gb,
            "reserved_for": sorted(g.reserved_for) if g.reserved_for is not None else None,
            "replicas": [
                {"id": rid, "model": m, "state": state(fleet, rid), "adapters": sorted(held.get(rid, ()))}
                for rid, m in _on(fleet, g.id)
            ],
        }
        for g in planner.inv.gpus
    ]


def load_seconds(fleet: Fleet) -> dict[str, list[float]]:
    """Per model: the seconds its last launches took to be ready (at most 5)."""
    return {m: [round(t, 2) for t in ts[-5:]] for m, ts in fleet.load_times.items()}


def refresh_metrics(fleet: Fleet) -> None:
    planner = fleet.planner
    gauges = [(g.id, g.node, planner.used[g.id], g.vram_gb) for g in planner.inv.gpus]
    on = [(g.id, rid, m, state(fleet, rid)) for g in planner.inv.gpus for rid, m in _on(fleet, g.id)]
    fleet.rt.metrics.refresh_fleet(gauges, on)
