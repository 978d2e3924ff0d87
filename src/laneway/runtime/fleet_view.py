"""What a live fleet shows: each replica's state and process (``/readyz``), each GPU's VRAM
and replicas (the dashboard), and the same as Prometheus gauges (``/metrics``).

In a cluster the placement is the leader's: it publishes :func:`placed` of its core with
its estimates, and every replica shows that (:attr:`Fleet.cluster_view`), with the process
of each engine it started itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from laneway.core.gpu_placement import GpuPlacement
    from laneway.runtime.fleet import Fleet


def _state(planner: GpuPlacement, rid: str, now: float, ready: Callable[[str], bool]) -> str:
    if rid in planner.asleep:
        return "asleep"
    if not ready(rid):
        return "loading"
    return "draining" if planner.replicas[rid].draining > now else "ready"


def placed(planner: GpuPlacement, now: float, ready: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """Where ``planner`` placed what: ``replicas`` (per replica: its model, GPUs, state and
    adapters) and ``gpus`` (per GPU: VRAM used of total, the replicas on it); a replica is
    ready once ``ready`` says so (by default, once the placement has it ready)."""
    is_ready = ready or (lambda rid: rid in planner.replicas and planner.replicas[rid].ready)
    held = planner.adapters.resident
    replicas = {
        rid: {
            "model": r.model.name,
            "gpus": list(r.gpus),
            "state": _state(planner, rid, now, is_ready),
            "adapters": sorted(held.get(rid, ())),  # (LoRA adapters loaded into it)
        }
        for rid, r in [*planner.replicas.items(), *planner.asleep.items()]
    }
    gpus = []
    for g in planner.inv.gpus:
        here = [(rid, r.model.name) for rid, r in planner.vram.on_gpu[g.id].items()]
        here += [(rid, r.model.name) for rid, r in planner.asleep.items() if g.id in r.gpus]
        gpus.append(
            {
                "id": g.id,
                "node": g.node,
                "vram_used_gb": round(planner.vram.used[g.id], 3),
                "vram_total_gb": g.vram_gb,
                "reserved_for": sorted(g.reserved_for) if g.reserved_for is not None else None,
                "replicas": [
                    {
                        "id": rid,
                        "model": m,
                        "state": replicas[rid]["state"],
                        "adapters": replicas[rid]["adapters"],
                    }
                    for rid, m in here
                ],
            }
        )
    return {"replicas": replicas, "gpus": gpus}


def _view(fleet: Fleet) -> dict[str, Any]:
    if fleet.cluster_view is not None:
        return fleet.cluster_view
    return placed(fleet.planner, fleet.rt.now(), lambda rid: rid in fleet.rt.workers)


def replicas(fleet: Fleet) -> dict[str, dict[str, object]]:
    """Per replica: its model, GPUs, state, adapters and process (one this server started)."""
    out: dict[str, dict[str, object]] = {}
    for rid, r in _view(fleet)["replicas"].items():
        engine = fleet.engines.get(rid) or fleet.sleeping.get(rid)
        out[rid] = {
            **r,
            "pid": None if engine is None else engine.pid,
            "url": None if engine is None else engine.url,
        }
    return out


def gpus(fleet: Fleet) -> list[dict[str, Any]]:
    """Per GPU: its VRAM used of total, and the replicas on it (with the adapters they hold)."""
    out: list[dict[str, Any]] = _view(fleet)["gpus"]
    return out


def load_seconds(fleet: Fleet) -> dict[str, list[float]]:
    """Per model: the seconds its last launches took to be ready (at most 5)."""
    return {m: [round(t, 2) for t in ts[-5:]] for m, ts in fleet.load_times.items()}


def refresh_metrics(fleet: Fleet) -> None:
    shown = gpus(fleet)
    gauges = [
        (str(g["id"]), str(g["node"]), float(g["vram_used_gb"]), float(g["vram_total_gb"])) for g in shown
    ]
    on = [
        (str(g["id"]), str(r["id"]), str(r["model"]), str(r["state"])) for g in shown for r in g["replicas"]
    ]
    fleet.rt.metrics.refresh_fleet(gauges, on)
