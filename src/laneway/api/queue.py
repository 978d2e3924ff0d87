"""``GET /v1/queue/estimate``: what a request of a class would wait now, with its interval,
what it rests on and the asking tenant's quotas."""

from __future__ import annotations

import math

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from laneway.api.params import authenticate, parse_class, priority_header, query_value
from laneway.api.state import runtime_of
from laneway.errors import ClassNotAllowed, ModelNotFound


async def queue_estimate(request: Request) -> Response:
    """``?priority=P1&model=M``: how long a new request of that class would wait now."""
    runtime = runtime_of(request)
    config = runtime.config
    tenant = authenticate(request, config)
    query = request.query_params
    raw = query_value(query, "priority") or priority_header(request.headers)
    if raw is not None:
        cls = parse_class(raw, config, "priority")
    elif tenant is not None and tenant.policy.default_class is not None:
        cls = tenant.policy.default_class
    else:
        cls = config.default_priority
    model = query_value(query, "model")
    if model is not None:
        model = config.aliases.get(model, model)
        if model not in runtime.models:
            raise ModelNotFound(f"the model {model!r} does not exist", param="model")
        fleet = runtime.fleet
        never = fleet.cfg.inventory.never(model, cls) if fleet is not None else None
        if never is not None:  # (what a request of it would be answered: it could never run)
            raise ModelNotFound(never, param="model")
    wait, span = runtime.estimate_range(cls, model)
    quota_wait = 0.0
    detail = span.detail
    refused = runtime.sched.quota_refusal(tenant.name if tenant else None, cls, runtime.now())
    if refused is not None:  # what the request would be answered now, instead of queued
        reason, message, quota_wait = refused
        if reason == "not_entitled":
            raise ClassNotAllowed(message, param="priority")
        wait += quota_wait  # (refused until then; then it waits in the queue)
        detail = f"its tenant's quota lets it in after {quota_wait:.3g} s; then: {detail}"
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
            "basis_detail": detail,
            "queued": runtime.sched.queued,
            "quota": None
            if refused is None
            else {"reason": refused[0], "message": refused[1], "retry_after_s": round(quota_wait, 3)},
        }
    )
