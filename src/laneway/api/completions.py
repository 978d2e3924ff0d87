"""``POST /v1/chat/completions`` and ``POST /v1/completions``.

The request is queued in laneway (never in the engine); the handler waits on
its ticket. A streaming answer starts once the first text is there, so a
request that times out in the queue still gets a plain 503 with
``Retry-After``; after that, text streams as OpenAI chunks, ending with
``data: [DONE]``. Errors after the stream began are sent as an ``error``
event.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from laneway.api.errors import request_error
from laneway.api.formats import DONE_LINE, Shape, extension, sse
from laneway.api.params import authenticate, parse_job, priority, read_json
from laneway.api.streaming import DisconnectWatch, EventStream
from laneway.errors import RequestError
from laneway.generation import Delta, Done
from laneway.runtime import Runtime, Ticket

_GONE = Response(status_code=499)  # what a handler returns to a client that left


async def chat_completions(request: Request) -> Response:
    return await _complete(request, chat=True)


async def completions(request: Request) -> Response:
    return await _complete(request, chat=False)


async def _complete(request: Request, *, chat: bool) -> Response:
    runtime: Runtime = request.app.state.runtime
    config = runtime.config
    tenant = authenticate(request, config)
    body = await read_json(request, config.max_body_bytes)
    parsed = parse_job(body, chat, config, runtime.models)
    cls = priority(body, request.headers, tenant, config)
    ticket = runtime.submit(
        parsed.job,
        cls,
        tenant=tenant.name if tenant is not None else None,
        preemptible=parsed.preemptible,
        deltas=parsed.stream,  # a whole answer needs only the Done, which holds all the text
    )
    shape = Shape(chat, parsed.job.id, parsed.job.model, int(time.time()))
    watch = DisconnectWatch(request.receive, lambda: runtime.cancel(ticket))
    try:
        try:
            first = await ticket.next()
            if not parsed.stream:
                done = first
                while type(done) is not Done:
                    done = await ticket.next()
        finally:
            watch.stop()
    except RequestError as exc:
        return _GONE if watch.gone else request_error(exc)
    except asyncio.CancelledError:
        runtime.cancel(ticket)
        raise
    if watch.gone:
        return _GONE
    if not parsed.stream:
        assert type(done) is Done
        return JSONResponse(shape.final(done.text, done.finish_reason, done.usage, ticket))
    chunks = _chunks(shape, ticket, first, parsed.include_usage)
    return EventStream(chunks, lambda: runtime.cancel(ticket))


async def _chunks(
    shape: Shape, ticket: Ticket, first: Delta | Done, include_usage: bool
) -> AsyncIterator[bytes]:
    if shape.chat:
        yield sse(_with_usage(shape.chunk("", first=True), include_usage))
    item: Delta | Done = first
    try:
        while True:
            if isinstance(item, Done):
                last = shape.chunk(None if shape.chat else "", item.finish_reason)
                last["laneway"] = extension(ticket)
                yield sse(_with_usage(last, include_usage))
                if include_usage:
                    yield sse(shape.usage_chunk(item.usage))
                yield DONE_LINE
                return
            yield sse(_with_usage(shape.chunk(item.text), include_usage))
            item = await ticket.next()
    except RequestError as exc:
        error = {"message": exc.message, "type": exc.type, "code": exc.code, "param": exc.param}
        yield sse({"error": error})


def _with_usage(chunk: dict[str, object], include_usage: bool) -> dict[str, object]:
    if include_usage:
        chunk["usage"] = None
    return chunk
