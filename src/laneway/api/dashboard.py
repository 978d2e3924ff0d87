"""``GET /dashboard``: a live page for operators; ``GET /dashboard/events``: its figures.

The page (:mod:`laneway.api.dashboard_page`, one HTML file with a small
hand-written script, no build step) reads ``/dashboard/events``, a stream of
Server-Sent Events with one JSON snapshot a second (:func:`snapshot`): per
class the requests queued and running, the oldest wait and the wait estimate;
per worker its slots and the requests on them with their class and progress;
the counts of completions, preemptions and rejections (the page turns them into
what happened over the last minutes); per tenant its queued and running
requests and the requests and tokens it was served; the batches not ended yet,
with their progress (from the store).

It follows ``/metrics``'s rules: open where ``/metrics`` is, and with
``[server] ops_auth = true`` both need one of the tenants' keys
(``Authorization: Bearer KEY``, or ``?key=KEY`` for the page and its stream,
which a browser's EventSource cannot give a header). ``[server] dashboard =
false`` turns it off (404).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse

from laneway.api.dashboard_page import PAGE
from laneway.api.state import runtime_of
from laneway.errors import NotFound, Unauthorized
from laneway.runtime import Phase, Runtime, fleet_view
from laneway.runtime.ticket import count_by_class
from laneway.store import ACTIVE, Store, StoreUnavailable

EVERY_S = 1.0  # a snapshot a second
HISTORY_S = 300.0  # the counters the server keeps for a page that opens (its "last 5 minutes")
HISTORY_EVERY_S = 10.0
MAX_BATCHES = 50  # the batches shown (the oldest running first)
STREAM_LIMIT_S = 3600.0  # a page reconnects after this (EventSource does it by itself)


def check_ops(request: Request) -> Runtime:
    """What ``/metrics`` and the dashboard ask: a tenant's key where ``ops_auth`` is on."""
    runtime = runtime_of(request)
    config = runtime.config
    if config.ops_auth:
        key = request.query_params.get("key")
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer "):
            key = header[7:].strip()
        if not key or config.tenant_for_key(key) is None:
            raise Unauthorized("this needs an API key (Authorization: Bearer KEY, or ?key=KEY)")
    return runtime


def _seconds(value: float) -> float | None:
    return round(value, 3) if math.isfinite(value) else None


def snapshot(runtime: Runtime) -> dict[str, Any]:
    """The figures of one instant."""
    now = runtime.now()
    names = runtime.classes.names
    tickets = list(runtime.tickets.values())
    per_class = count_by_class(tickets, now)  # (as /metrics counts them)
    tenants: dict[str, dict[str, int]] = {}
    on_worker: dict[str, list[dict[str, Any]]] = {w: [] for w in runtime.workers}
    for t in tickets:
        mine = tenants.setdefault(t.tenant or "", {"queued": 0, "running": 0})
        if t.phase is Phase.QUEUED:
            mine["queued"] += 1
        elif t.phase in (Phase.RUNNING, Phase.STOPPING) and t.worker is not None:
            mine["running"] += 1
            on_worker.setdefault(t.worker, []).append(
                {
                    "id": t.id,
                    "class": t.class_name,
                    "tenant": t.tenant,
                    "tokens": t.tokens,
                    "max_tokens": t.job.params.max_tokens,
                    "running_s": round(now - t.arrival_s - t.queue_s, 1),
                    "preemptions": t.preemptions,
                }
            )
    counts = counters(runtime)
    classes = [
        {
            "name": n,
            "queued": per_class.queued.get(n, 0),
            "running": per_class.running.get(n, 0),
            "oldest_wait_s": round(per_class.oldest_s.get(n, 0.0), 1),
            "estimate_s": _seconds(runtime.estimate_wait(i, None)),
            **counted,
        }
        for i, (n, counted) in enumerate(zip(names, counts["classes"], strict=True))
    ]
    workers = []
    expected = runtime.sched.snapshot().prefix_hits
    reported = runtime.engines.reported_hits()
    windows = runtime.engines.saturation.windows
    isolated = {spec.id for spec in runtime.specs if spec.isolate}
    for name, worker in runtime.workers.items():
        cap = worker.capacity()
        window = windows.get(name)
        workers.append(
            {
                "name": name,
                "slots": cap.slots,
                "busy": cap.busy,
                # in service, or taken out of placement (its probes fail: why, as /readyz says)
                "up": name not in runtime.prober.down,
                "down_because": runtime.prober.why_down(name),
                # urgent work runs there with no batch work beside it (``isolate``)
                "isolate": name in isolated,
                # upstreams: how many it is sent at once (its saturation gate), and the share
                # of the prompts placement expects its prefix cache to hold, and its engine says
                "concurrency": window.limit if window is not None else None,
                "prefix_hits_expected": expected.get(name),
                "prefix_hits_reported": reported.get(name),
                "running": on_worker.get(name, []),
            }
        )
    for tenant, (done, prompt, completion) in runtime.usage.items():
        row = tenants.setdefault(tenant, {"queued": 0, "running": 0})
        row.update(completed=done, prompt_tokens=prompt, completion_tokens=completion)
    return {
        "time": counts["time"],
        "classes": classes,
        "workers": workers,
        "rejections": counts["rejections"],
        "tenants": [{"name": k or "(none)", **v} for k, v in sorted(tenants.items())],
        # a fleet's GPUs: VRAM used of total, the replicas on each and their engines' state,
        # and how long each model's engine took to be ready (its last launches)
        "gpus": fleet_view.gpus(runtime.fleet) if runtime.fleet is not None else None,
        "load_s": fleet_view.load_seconds(runtime.fleet) if runtime.fleet is not None else None,
    }


def counters(runtime: Runtime) -> dict[str, Any]:
    """The counters the "last 5 minutes" table subtracts: per class completed and
    preempted, rejections by reason; with the time they were read."""
    reg = runtime.metrics.registry

    def count(name: str, labels: dict[str, str]) -> int:
        return int(reg.get_sample_value(name, labels) or 0)

    rejections = {
        s.labels["reason"]: int(s.value)
        for metric in reg.collect()
        if metric.name == "laneway_rejections"
        for s in metric.samples
        if s.name == "laneway_rejections_total" and s.value
    }
    return {
        "time": time.time(),
        "classes": [
            {
                "name": n,
                "completed": count("laneway_requests_total", {"class": n, "outcome": "completed"}),
                "preemptions": count("laneway_preemptions_total", {"class": n}),
            }
            for n in runtime.classes.names
        ],
        "rejections": rejections,
    }


class History:
    """The counters every ``every_s`` for the last ``window_s``, kept by the server, so that a
    page opened now shows the last minutes at once (not from 0)."""

    def __init__(self, window_s: float = HISTORY_S, every_s: float = HISTORY_EVERY_S) -> None:
        self.every_s = every_s
        self.samples: deque[dict[str, Any]] = deque(maxlen=int(window_s / every_s) + 1)

    async def keep(self, runtime: Runtime) -> None:
        """Sample until cancelled (the app's lifespan runs it)."""
        while True:
            self.samples.append(counters(runtime))
            await asyncio.sleep(self.every_s)


async def batches(request: Request, runtime: Runtime) -> list[dict[str, Any]] | None:
    """The batches not ended yet and how far each is (``None``: the store cannot be reached)."""
    store: Store | None = getattr(request.app.state, "store", None)
    if store is None:
        return []
    try:
        active = await store.batches_in(ACTIVE)
    except StoreUnavailable:
        return None
    now = time.time()
    names = runtime.classes.names
    return [
        {
            "id": b.id,
            "tenant": b.tenant,
            "priority": names[b.priority] if 0 <= b.priority < len(names) else str(b.priority),
            "status": str(b.status),
            "total": b.total,
            "done": b.completed,
            "failed": b.failed,
            "expires_in_s": round(max(0.0, b.expires_at - now), 1),
        }
        for b in active[:MAX_BATCHES]
    ]


async def page(request: Request) -> Response:
    runtime = runtime_of(request)
    if not runtime.config.dashboard:
        raise NotFound("the dashboard is off ([server] dashboard = false)")
    check_ops(request)
    history: History | None = getattr(request.app.state, "history", None)
    now = {**snapshot(runtime), "batches": await batches(request, runtime)}
    first = {"past": list(history.samples) if history is not None else [], "now": now}
    # (in a script element: no "</" may end it early)
    data = json.dumps(first, separators=(",", ":")).replace("<", "\\u003c")
    html = PAGE.replace("/*FIRST*/null", data, 1)
    return HTMLResponse(html, headers={"Cache-Control": "no-store"})


async def events(request: Request) -> Response:
    runtime = runtime_of(request)
    if not runtime.config.dashboard:
        raise NotFound("the dashboard is off ([server] dashboard = false)")
    check_ops(request)
    state = request.app.state

    async def stream() -> AsyncIterator[bytes]:
        ends = time.monotonic() + STREAM_LIMIT_S
        while time.monotonic() < ends and not runtime.closed and not getattr(state, "stopping", False):
            snap = {**snapshot(runtime), "batches": await batches(request, runtime)}
            data = json.dumps(snap, separators=(",", ":"))
            yield f"data: {data}\n\n".encode()
            await asyncio.sleep(EVERY_S)

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})
