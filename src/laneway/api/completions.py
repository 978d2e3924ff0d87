"""``POST /v1/chat/completions``, ``POST /v1/completions`` and ``POST /v1/embeddings``.

The request is queued in laneway (never in the engine); the handler waits on
its ticket. A streaming answer starts once the first text is there, so a
request that times out in the queue still gets a plain 503 with
``Retry-After``; after that, text streams as OpenAI chunks (an upstream's
own, where an upstream runs it), ending with ``data: [DONE]``. An error after
the stream began is sent as an ``error`` event, then ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from laneway.api.errors import request_error
from laneway.api.params import authenticate, priority, read_json_sized
from laneway.api.streaming import DisconnectWatch, EventStream
from laneway.config.schema import TenantConfig
from laneway.errors import RequestError
from laneway.generation import CHAT, COMPLETION, EMBEDDING, RELAY, Delta, Done, Job, ResumeRule
from laneway.protocol import json_fast
from laneway.protocol.requests import parse_request, preemptibleflag
from laneway.protocol.responses import DONE_LINE, Shape, extension, sse
from laneway.runtime import Runtime, Ticket

_GONE = Response(status_code=499)  # what a handler returns to a client that left


class JSON(Response):
    """A JSON answer (ASCII-escaped: any string the engine made can be sent)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return json_fast.dumps(content, ascii=True)


async def chat_completions(request: Request) -> Response:
    return await _complete(request, CHAT)


async def completions(request: Request) -> Response:
    return await _complete(request, COMPLETION)


async def embeddings(request: Request) -> Response:
    return await _complete(request, EMBEDDING)


async def _complete(request: Request, kind: str) -> Response:
    runtime: Runtime = request.app.state.runtime
    config = runtime.config
    tenant = authenticate(request, config)
    body, size = await read_json_sized(request, config.max_body_bytes)
    parsed = parse_request(body, kind, config, runtime.support)
    job = parsed.job
    ticket = submit(request, runtime, job, body, tenant, size)
    # (answered with the name the client used: an alias stays an alias)
    shape = Shape(kind, job.id, body["model"], int(time.time()), body.get("service_tier"))
    first = await first_event(request, runtime, ticket, parsed.stream)
    if isinstance(first, Response):
        return first
    if not parsed.stream:
        assert type(first) is Done
        return JSON(shape.final(first, extension(ticket)))
    forwarded = runtime.support[job.model].passthrough
    chunks = _chunks(shape, ticket, first, parsed.include_usage, forwarded)
    return EventStream(chunks, lambda: runtime.cancel(ticket))


def submit(
    request: Request,
    runtime: Runtime,
    job: Job,
    body: Mapping[str, Any],
    tenant: TenantConfig | None,
    size: int,
) -> Ticket:
    """Queue a client's ``job`` (made from ``body``, ``size`` bytes): its class from the body,
    the header, the tier or the tenant; preemptible unless the client opted out or it cannot
    resume; each Delta only for a stream (a whole answer needs only the Done, which holds all
    of it); in the client's trace (``traceparent``)."""
    return runtime.submit(
        job,
        priority(body, request.headers, tenant, runtime.config, tiers=job.kind != RELAY),
        tenant=tenant.name if tenant is not None else None,
        preemptible=preemptibleflag(body) and job.resume is not ResumeRule.NONE,
        deltas=job.stream,
        size=size,
        traceparent=request.headers.get("traceparent"),
        tracestate=request.headers.get("tracestate"),
    )


async def first_event(
    request: Request,
    runtime: Runtime,
    ticket: Ticket,
    stream: bool,
    worded: Callable[[RequestError], RequestError] = lambda exc: exc,
) -> Delta | Done | Response:
    """What a handler answers from: the ticket's first event (a stream's), or its ``Done``
    (a whole answer); or the response already due (the request's error, or nothing for a
    client that left). A client that goes away meanwhile cancels the request."""
    watch = DisconnectWatch(request.receive, lambda: runtime.cancel(ticket))
    try:
        try:
            first = await ticket.next()
            if not stream:
                while type(first) is not Done:
                    first = await ticket.next()
        finally:
            watch.stop()
    except RequestError as exc:  # (``worded``: in the words of the API it came through)
        return _GONE if watch.gone else request_error(worded(exc))
    except asyncio.CancelledError:
        runtime.cancel(ticket)
        raise
    return _GONE if watch.gone else first


async def _chunks(
    shape: Shape, ticket: Ticket, first: Delta | Done, include_usage: bool, forwarded: bool
) -> AsyncIterator[bytes]:
    """The stream: an upstream's chunks as it sent them (owned), or chunks built from the
    engine's text; the last with the ``laneway`` object. The chunks at hand go out
    together (one write, not one a chunk: an engine's chunks often come several to a read);
    none waits for the next."""
    item: Delta | Done = first
    out: list[bytes] = []
    if shape.chat and not forwarded:  # each choice's role first, with the prompt's ids when asked
        prompt = first.prompt_ids
        for i in range(ticket.job.params.n):
            role = shape.chunk("", first=True, index=i, prompt_ids=prompt if i == 0 else None)
            out.append(sse(_with_usage(role, include_usage)))
        if type(first) is Delta:
            item = replace(first, prompt_ids=None)
    try:
        while True:
            if type(item) is Done:
                for chunk in shape.last_chunks(item, extension(ticket), include_usage):
                    out.append(
                        sse(
                            chunk if forwarded else _with_usage(chunk, include_usage and "usage" not in chunk)
                        )
                    )
                out.append(DONE_LINE)
                yield b"".join(out)
                return
            assert type(item) is Delta
            if item.chunk is not None:
                out.append(sse(shape.own(item.chunk)))
            else:
                chunk = shape.chunk(
                    item.text,
                    index=item.index,
                    logprobs=item.logprobs,
                    token_ids=item.token_ids,
                    prompt_ids=item.prompt_ids,
                )
                out.append(sse(_with_usage(chunk, include_usage)))
            if not ticket.pending:
                yield b"".join(out)
                out.clear()
            item = await ticket.next()
    except RequestError as exc:  # the stream ends with the error, then [DONE] (as vLLM ends its own)
        error = {"message": exc.message, "type": exc.type, "code": exc.code, "param": exc.param}
        out.append(sse({"error": error}))
        out.append(DONE_LINE)
        yield b"".join(out)


def _with_usage(chunk: dict[str, object], include_usage: bool) -> dict[str, object]:
    if include_usage:
        chunk["usage"] = None
    return chunk
