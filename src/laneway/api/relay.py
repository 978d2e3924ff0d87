"""``POST /v1/…`` for what laneway does not serve itself: passed through to an upstream.

A request to any other path under ``/v1`` whose JSON body names a model served by
upstream workers (Anthropic's ``/v1/messages``, ``/v1/rerank``, ``/v1/score`` …)
is scheduled by class like every other (queues, quotas, preemption) and sent to
the same path of the upstream as the client sent it (:mod:`laneway.protocol.relayed`);
the answer is the upstream's own, byte for byte (a stream event by event). Any
other request there is answered as an unknown route: 404 (405 on a path laneway
serves with other methods).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match

from laneway.api.completions import first_event, submit
from laneway.api.params import authenticate, json_object, read_body
from laneway.api.streaming import EventStream
from laneway.config.schema import TenantConfig
from laneway.errors import InvalidRequest, NotFound, RequestError
from laneway.generation import Delta, Done
from laneway.protocol.relayed import relay_job
from laneway.protocol.requests import Support, model_of
from laneway.protocol.responses import event_sse
from laneway.runtime import Runtime, Ticket

ROUTE = "/v1/{path:path}"
_SEGMENT = re.compile(r"[A-Za-z0-9_\-.:]+")
# a query string passed on as sent (Anthropic's clients send ?beta=true): URL characters only
_QUERY = re.compile(r"[A-Za-z0-9_\-.~%=&+,;:@/!$'()*]*")


def _methods_here(request: Request) -> set[str]:
    """The methods laneway's other routes serve on this path (none: it serves no such path)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if getattr(route, "path", None) == ROUTE:
            continue
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return methods


async def relay(request: Request) -> Response:
    methods = _methods_here(request)
    if methods:  # (as Starlette answers a path served with other methods)
        raise HTTPException(405, headers={"Allow": ", ".join(sorted(methods))})
    return await relay_here(request)


async def relay_here(request: Request) -> Response:
    """Pass a ``POST /v1/…`` through to an upstream of the model its body names (404 when
    there is none): the pass-through route, and paths laneway names only to pass them on."""
    endpoint = request.path_params.get("path") or request.url.path.removeprefix("/v1/")
    segments = endpoint.split("/")
    if request.method != "POST" or not all(_SEGMENT.fullmatch(p) and p not in (".", "..") for p in segments):
        raise HTTPException(404)  # (a path of plain names only: nothing leaves the upstream's /v1)
    runtime: Runtime = request.app.state.runtime
    config = runtime.config
    tenant = authenticate(request, config)
    passes = any(s.passthrough for s in runtime.support.values())  # (upstreams take pass-throughs)
    try:
        raw = await read_body(request, config.max_body_bytes)
    except RequestError:  # too large (or compressed) to see which model it names
        if passes:
            raise  # (it may be meant for an upstream: the limit is why it is not taken)
        raise HTTPException(404) from None  # (no upstream to pass anything to: no such route)
    try:
        body = json_object(raw)
    except RequestError:
        loose = _loosely(raw)
        found = _served(loose, runtime)
        if found is not None and found[1].passthrough:
            raise  # (meant for an upstream's model: what is wrong with it, as on any route)
        if passes and loose is _TOO_DEEP:
            raise  # (which model it names cannot be read: what is wrong with it is said)
        if passes:
            raise _unrouted(endpoint, "its body is not a JSON object") from None
        raise HTTPException(404) from None
    found = _served(body, runtime)
    if found is None:
        if passes:
            named = body.get("model")
            said = f" (it names {named!r})" if isinstance(named, str) else ""
            raise _unrouted(endpoint, f"its body names no model an upstream worker serves{said}")
        raise HTTPException(404)
    model, served = found
    if not served.passthrough:  # (a model laneway serves itself: why this path is not one of its)
        raise NotFound(
            f"no such route: POST /v1/{endpoint} (laneway passes it on to upstream workers "
            f"only; model {body['model']!r} is served by laneway's own engine)"
        )
    query = request.url.query
    if not _QUERY.fullmatch(query):
        raise InvalidRequest("the query string holds characters a URL does not", param="query")
    sent_to = f"{endpoint}?{query}" if query else endpoint
    return await passed_on(request, runtime, tenant, model, sent_to, body, len(raw))


def _unrouted(endpoint: str, why: str) -> NotFound:
    """The 404 of a path laneway would pass on, had its body named an upstream's model."""
    return NotFound(
        f"no such route: POST /v1/{endpoint} (laneway passes a request there on to an upstream "
        f"worker of the model its body names; {why})"
    )


def _served(body: object, runtime: Runtime) -> tuple[str, Support] | None:
    """The model ``body`` names (its alias resolved) and what serves it; ``None``: it names
    none laneway serves."""
    if not isinstance(body, dict):
        return None
    try:
        return model_of(body, runtime.support, runtime.config.aliases)
    except RequestError:
        return None


_TOO_DEEP = object()  # (a body nested too deep to read at all)


def _loosely(raw: bytes) -> object:
    """``raw`` as a lenient JSON reader takes it (numbers past a float's range, NaN), or
    ``None`` (:data:`_TOO_DEEP`: nested past what it reads): only to see which model a
    body the strict reader refused names."""
    try:
        return json.loads(raw)
    except ValueError:
        return None
    except RecursionError:
        return _TOO_DEEP


async def passed_on(
    request: Request,
    runtime: Runtime,
    tenant: TenantConfig | None,
    model: str,
    endpoint: str,
    body: dict[str, Any],
    size: int,
) -> Response:
    """``body`` sent to ``endpoint`` of an upstream of ``model``, scheduled by class as any
    request; its answer as the upstream gave it."""
    job = relay_job("relay-" + uuid.uuid4().hex[:24], model, endpoint, body, request.headers.items())
    ticket = submit(request, runtime, job, body, tenant, size)
    first = await first_event(request, runtime, ticket, job.stream)
    if isinstance(first, Response):
        return first
    if not job.stream:
        assert type(first) is Done and first.raw is not None
        content, ctype = first.raw
        return Response(content, media_type=ctype or None)
    return EventStream(_events(ticket, first), lambda: runtime.cancel(ticket))


async def _events(ticket: Ticket, first: Delta | Done) -> AsyncIterator[bytes]:
    item: Delta | Done = first
    try:
        while type(item) is Delta:
            if item.chunk is not None:
                yield event_sse(item.chunk)
            item = await ticket.next()
    except RequestError as exc:  # after the stream began: an error event (both kinds of client read it)
        error = {"message": exc.message, "type": exc.type, "code": exc.code, "param": exc.param}
        yield event_sse({"type": "error", "error": error})
        return
    assert type(item) is Done
    if item.raw is not None:
        yield item.raw[0]
