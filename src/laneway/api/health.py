"""What operators and orchestrators ask: ``GET /`` (where things are), ``/metrics``
(Prometheus), ``/healthz`` (the process answers), ``/readyz`` (every worker healthy, and in a
cluster Redis reached)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from laneway.api.state import runtime_of
from laneway.runtime import fleet_view
from laneway.runtime.metrics import CONTENT_TYPE


async def metrics(request: Request) -> Response:
    from laneway.api.dashboard import check_ops

    runtime = check_ops(request)
    runtime.refresh_metrics()
    batches = getattr(request.app.state, "batches", None)
    if batches is not None:
        batches.refresh_metrics()
    return Response(runtime.metrics.render(), media_type=CONTENT_TYPE)


async def index(request: Request) -> Response:
    """``GET /``: the dashboard where there is one; else what is served where."""
    runtime = runtime_of(request)
    if runtime.config.dashboard:
        return RedirectResponse("dashboard" + (f"?{request.url.query}" if request.url.query else ""), 307)
    return JSONResponse(
        {
            "service": "laneway",
            "api": "/v1 (OpenAI-compatible)",
            "metrics": "/metrics",
            "health": "/healthz",
            "ready": "/readyz",
        }
    )


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Ready when every worker is healthy (as its last probe found it) and, with a fleet,
    no model's engine fails to start."""
    runtime = runtime_of(request)
    details = {}
    ready = not runtime.closed
    for name, st in runtime.prober.state.items():
        ok = st.ok and name not in runtime.prober.down
        ready = ready and ok
        details[name] = {"ok": ok, "detail": st.detail}
        worker = runtime.workers.get(name)
        caps = worker.capabilities() if worker is not None else None  # (an upstream's engine, as learnt)
        if caps is not None:
            details[name]["capabilities"] = caps
    out: dict[str, object] = {"workers": details}
    fleet = runtime.fleet
    if fleet is not None:  # its engines, and the models whose engines fail to start
        failing = {m: f.reason for m, f in fleet.faults.failing.items()}
        now = runtime.now()  # (not ready while a model backs off; then it is tried again when asked)
        ready = ready and not any(f.until > now for f in fleet.faults.failing.values())
        out["fleet"] = {"replicas": fleet_view.replicas(fleet), "failing": failing}
    node = getattr(request.app.state, "node", None)
    if node is not None:  # a replica: it serves only while it reaches the cluster's Redis
        cluster = node.status()
        ready = ready and cluster["ok"]
        out["cluster"] = cluster
    return JSONResponse({"status": "ready" if ready else "not ready", **out}, 200 if ready else 503)
