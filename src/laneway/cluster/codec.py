"""Requests and decisions as they travel through Redis: JSON lists, the first item a kind
(``s`` a request submitted; ``D`` dispatch, ``P`` preempt, ``R`` reject)."""

from __future__ import annotations

import math
from typing import Any

from laneway.core import Decision, Dispatch, Preempt, Reject, Request


def encode_request(req: Request, home: str) -> list[Any]:
    return [
        "s",
        req.id,
        home,
        req.priority,
        req.arrival_s,
        req.model,
        req.tenant,
        req.preemptible,
        req.timeout_s,
        req.est_service_s,
        req.prompt_tokens,
        req.output_tokens,
    ]


def decode_request(e: list[Any]) -> tuple[Request, str]:
    _, rid, home, priority, arrival, model, tenant, preemptible, timeout, est, prompt, output = e
    req = Request(
        rid,
        priority,
        arrival,
        model=model,
        tenant=tenant,
        preemptible=preemptible,
        timeout_s=timeout,
        est_service_s=est,
        prompt_tokens=prompt,
        output_tokens=output,
    )
    return req, home


def encode_decision(d: Decision) -> list[Any]:
    if type(d) is Dispatch:
        return ["D", d.request_id, d.worker_id, d.resume]
    if type(d) is Preempt:
        return ["P", d.request_id, d.worker_id, d.mode, d.for_class]
    assert type(d) is Reject
    return ["R", d.request_id, d.reason, d.message, d.estimated_wait_s, d.retry_after_s]


def decode_decision(e: list[Any]) -> Decision:
    kind = e[0]
    if kind == "D":
        return Dispatch(e[1], e[2], e[3])
    if kind == "P":
        return Preempt(e[1], e[2], e[3], e[4])
    return Reject(e[1], e[2], e[3], _inf(e[4]), _inf(e[5]))


def _inf(v: float | None) -> float:
    return math.inf if v is None else float(v)
