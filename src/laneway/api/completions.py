"""``POST /v1/chat/completions`` and ``POST /v1/completions``.

The request is queued in laneway (never in the engine); the handler waits on
its ticket. A streaming answer starts once the first text is there, so a
request that times out in the queue still gets a plain 503 with
``Retry-After``; after that, text streams as OpenAI chunks, ending with
``data: [DONE]``. Errors after the stream began are sent as an ``error``
event.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from laneway.api.errors import request_error
from laneway.api.formats import DONE_LINE, Shape, extension, sse
from laneway.api.params import authenticate, parse_job, priority, read_json
from laneway.api.streaming import EventStream, unless_disconnected
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
        parsed.job, cls, tenant=tenant.name if tenant is not None else None, preemptible=parsed.preemptible
    )
    shape = Shape(chat, parsed.job.id, parsed.job.model, int(time.time()))
    events = ticket.events()
    present, first = await unless_disconnected(
        _first(events), request.receive, lambda: runtime.cancel(ticket)
    )
    if not present:
        return _GONE
    assert first is not None
    if isinstance(first, RequestError):
        return request_error(first)
    if not parsed.stream:
        present, done = await unless_disconnected(
            _rest(first, events), request.receive, lambda: runtime.cancel(ticket)
        )
        if not present:
            return _GONE
        assert done is not None
        if isinstance(done, RequestError):
            return request_error(done)
        return JSONResponse(shape.final(done.text, done.finish_reason, done.usage, ticket))
    chunks = _chunks(shape, ticket, first, events, parsed.include_usage)
    return EventStream(chunks, lambda: runtime.cancel(ticket))


async def _first(events: AsyncIterator[Delta | Done]) -> Delta | Done | RequestError:
    try:
        return await anext(events)
    except RequestError as exc:
        return exc


async def _rest(first: Delta | Done, events: AsyncIterator[Delta | Done]) -> Done | RequestError:
    if isinstance(first, Done):
        return first
    try:
        async for item in events:
            if isinstance(item, Done):
                return item
    except RequestError as exc:
        return exc
    raise AssertionError("a ticket's events end with Done")  # pragma: no cover


async def _chunks(
    shape: Shape,
    ticket: Ticket,
    first: Delta | Done,
    events: AsyncIterator[Delta | Done],
    include_usage: bool,
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
            item = await anext(events)
    except RequestError as exc:
        error = {"message": exc.message, "type": exc.type, "code": exc.code, "param": exc.param}
        yield sse({"error": error})


def _with_usage(chunk: dict[str, object], include_usage: bool) -> dict[str, object]:
    if include_usage:
        chunk["usage"] = None
    return chunk
