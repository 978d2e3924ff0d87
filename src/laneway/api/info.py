"""``GET /v1/models``, ``/v1/queue/estimate``, ``/metrics``, ``/healthz``, ``/readyz``."""

from __future__ import annotations

import math
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from laneway.api.params import PRIORITY_HEADER, authenticate, parse_class
from laneway.errors import ClassNotAllowed, ModelNotFound
from laneway.runtime import Runtime
from laneway.runtime.metrics import CONTENT_TYPE

STARTED = int(time.time())


def _runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


def _model(runtime: Runtime, name: str) -> dict[str, object]:
    """A served model (or an alias of one: ``root`` names the model it stands for), with
    the names clients may use for it and, where its workers say, its context length."""
    served = runtime.config.aliases.get(name, name)
    out: dict[str, object] = {"id": name, "object": "model", "created": STARTED, "owned_by": "laneway"}
    out["root"] = served
    out["aliases"] = sorted(a for a, m in runtime.config.aliases.items() if m == served)
    lens = [
        n
        for w, worker in runtime.workers.items()
        if runtime.served.get(w, w) == served and isinstance(n := getattr(worker, "max_model_len", None), int)
    ]
    if lens:
        out["max_model_len"] = min(lens)
    return out


async def models(request: Request) -> Response:
    runtime = _runtime(request)
    config = runtime.config
    authenticate(request, config)
    names = [*runtime.models, *sorted(a for a, m in config.aliases.items() if m in runtime.models)]
    return JSONResponse({"object": "list", "data": [_model(runtime, m) for m in names]})


async def model(request: Request) -> Response:
    """``GET /v1/models/{id}`` (an id may hold slashes, as Hugging Face names do)."""
    runtime = _runtime(request)
    config = runtime.config
    authenticate(request, config)
    name = request.path_params["model_id"]
    if config.aliases.get(name, name) not in runtime.models:
        raise ModelNotFound(f"the model {name!r} does not exist; served: {', '.join(runtime.models)}")
    return JSONResponse(_model(runtime, name))


async def queue_estimate(request: Request) -> Response:
    """``?priority=P1&model=M``: how long a new request of that class would wait now."""
    runtime = _runtime(request)
    config = runtime.config
    tenant = authenticate(request, config)
    query = request.query_params
    raw = query.get("priority") or request.headers.get(PRIORITY_HEADER)
    if raw is not None:
        cls = parse_class(raw, config, "priority")
    elif tenant is not None and tenant.policy.default_class is not None:
        cls = tenant.policy.default_class
    else:
        cls = config.default_priority
    model = query.get("model")
    if model is not None:
        model = config.aliases.get(model, model)
        if model not in runtime.models:
            raise ModelNotFound(f"the model {model!r} does not exist", param="model")
    wait, span = runtime.estimate_range(cls, model)
    quota_wait = 0.0
    refused = runtime.sched.quota_refusal(tenant.name if tenant else None, cls, runtime.now())
    if refused is not None:  # what the request would be answered now, instead of queued
        reason, message, quota_wait = refused
        if reason == "not_entitled":
            raise ClassNotAllowed(message, param="priority")
        wait += quota_wait  # (refused until then; then it waits in the queue)
    return JSONResponse(
        {
            "priority": config.scheduler.classes[cls].name,
            "model": model,
            "estimated_wait_s": round(wait, 3) if math.isfinite(wait) else None,
            # where the wait falls 80 % of the time (null: no bound known), and what it rests on
            "estimated_wait_range_s": [
                round(span.low_s + quota_wait, 3) if math.isfinite(span.low_s) else None,
                round(span.high_s + quota_wait, 3) if math.isfinite(span.high_s) else None,
            ],
            "basis": span.basis,
            "basis_detail": span.detail,
            "queued": runtime.sched.queued,
            "quota": None
            if refused is None
            else {"reason": refused[0], "message": refused[1], "retry_after_s": round(quota_wait, 3)},
        }
    )


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
    runtime = _runtime(request)
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
    """Ready when every worker is healthy (as its last probe found it)."""
    runtime = _runtime(request)
    details = {}
    ready = not runtime.closed
    for name, st in runtime.prober.state.items():
        ok = st.ok and name not in runtime.prober.down
        ready = ready and ok
        details[name] = {"ok": ok, "detail": st.detail}
        caps = getattr(runtime.workers[name], "caps", None)  # (an upstream's engine, as learnt)
        if caps is not None:
            details[name]["capabilities"] = caps.as_dict()
    out: dict[str, object] = {"workers": details}
    node = getattr(request.app.state, "node", None)
    if node is not None:  # a replica: it serves only while it reaches the cluster's Redis
        cluster = node.status()
        ready = ready and cluster["ok"]
        out["cluster"] = cluster
    return JSONResponse({"status": "ready" if ready else "not ready", **out}, 200 if ready else 503)
