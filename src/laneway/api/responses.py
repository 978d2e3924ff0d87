"""The Responses API: ``POST /v1/responses`` (streamed and not), ``GET`` and ``DELETE
/v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``, ``POST
/v1/responses/input_tokens``.

A response is served from the chat path (:mod:`laneway.protocol.responses_api`):
it is queued, classed, preempted and resumed as a chat request is. A response
made with ``store`` (the default) is kept in laneway's store (SQLite, or Redis
for replicas) under its tenant: only that tenant's key reads, continues
(``previous_response_id``) or deletes it; to another tenant it does not exist.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

from starlette.requests import Request
from starlette.responses import Response

from laneway.api.completions import JSON, first_event, submit
from laneway.api.files import tenant_of
from laneway.api.kept import check_can_keep, maybe_lost
from laneway.api.objects import after_param, limit_param, order_param, page
from laneway.api.params import authenticate, priority, read_json_sized
from laneway.api.relay import passed_on
from laneway.api.stored_responses import Kept, record_of
from laneway.api.streaming import EventStream
from laneway.errors import InvalidRequest, NotFound, RequestError
from laneway.generation import CHAT, Delta, Done, Job
from laneway.protocol.requests import model_of, parse_request, preemptibleflag
from laneway.protocol.responses import event_sse, extension
from laneway.protocol.responses_answer import Answer, failure_code, own
from laneway.protocol.responses_api import (
    ResponsesRequest,
    chat_body,
    forwarded_job,
    read_responses,
)
from laneway.runtime import Runtime, Ticket
from laneway.store import Store

log = logging.getLogger("laneway.api")
MAX_ITEMS_PAGE = 100


async def _context(request: Request, req: ResponsesRequest, owner: str) -> list[dict[str, Any]]:
    """The conversation ``req`` continues (its ``previous_response_id``'s), as input items."""
    if req.previous_response_id is None:
        return []
    try:
        previous = await record_of(request.app.state.store, req.previous_response_id, owner)
    except NotFound as exc:
        lost = maybe_lost(request, exc).message.removeprefix(exc.message)
        raise InvalidRequest(
            f"previous response with id {req.previous_response_id!r} not found{lost}",
            param="previous_response_id",
        ) from None
    if previous["context"] is None:  # (one still streaming, or one that failed or was cancelled)
        status = previous["response"]["status"]
        raise InvalidRequest(
            f"previous response with id {req.previous_response_id!r} is {status}: "
            "only a finished response can be continued",
            param="previous_response_id",
        )
    context: list[dict[str, Any]] = previous["context"]
    return context


# a chat field an error of the chat path names -> the Responses API's field for it
_FIELDS = {"max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens"}


def _worded(exc: RequestError, sent: Collection[str] = ()) -> RequestError:
    """An error of the chat path a response is made by, naming the fields the client sent
    (``max_output_tokens``, ``input``), not the chat request's; one that names a field the
    client did send (``max_tokens`` in a response's body: refused as it is) is left so."""
    param = exc.param
    if param is None or re.split(r"[.\[]", param, maxsplit=1)[0] in sent:
        return exc
    ours = _FIELDS.get(param) or ("input" if param.startswith("messages") else None)
    if ours is not None:
        if param in _FIELDS:
            exc.message = exc.message.replace(param, ours)
        exc.param = ours
    return exc


Handler = Callable[[Request], Awaitable[Response]]


def _in_its_words(handler: Handler) -> Handler:
    """``handler``, its errors naming the Responses API's fields (:func:`_worded`)."""

    @functools.wraps(handler)
    async def worded(request: Request) -> Response:
        try:
            return await handler(request)
        except RequestError as exc:
            raise _worded(exc, getattr(request.state, "sent", ())) from None

    return worded


@_in_its_words
async def create(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    store: Store = request.app.state.store
    config = runtime.config
    tenant = authenticate(request, config)
    owner = tenant.name if tenant is not None else ""
    body, size = await read_json_sized(request, config.max_body_bytes)
    request.state.sent = frozenset(body)  # (the fields its errors may name as they are)
    model, served = model_of(body, runtime.support, config.aliases)
    req = read_responses(body, engine=not served.passthrough)
    if req.store:  # (nothing new is kept while the cluster's store is known to have lost its data)
        check_can_keep(request)
    context = await _context(request, req, owner)
    if served.passthrough:  # to the upstream's own Responses API
        job = forwarded_job(req, model, context)
    else:  # from the chat path
        job = parse_request(chat_body(req, context), CHAT, config, runtime.support).job
        job = replace(job, id=req.id)  # (its logs and traces under the id its client holds)
    ticket = submit(request, runtime, job, body, tenant, size)
    answer = Answer(req, req.model, int(time.time()), body.get("service_tier"))  # (the client's name)
    first = await first_event(request, runtime, ticket, req.stream, _worded)
    if isinstance(first, Response):
        return first
    kept = Kept(store, owner, req, context, forwarded=served.passthrough)
    if not req.stream:
        assert type(first) is Done
        return JSON(await kept.final(answer, first, ticket))

    def gone() -> None:
        kept.cancelled = True
        runtime.cancel(ticket)

    return EventStream(_events(kept, answer, ticket, first), gone)


async def _events(kept: Kept, answer: Answer, ticket: Ticket, first: Delta | Done) -> AsyncIterator[bytes]:
    """The stream: an upstream's own events (laneway's id on its response objects), or
    events made from the engine's text; the last with the stored, finished response."""
    item: Delta | Done = first
    forwarded = kept.forwarded
    text = ""
    ended = False
    try:
        if type(item) is Delta:
            await kept.begin(answer)
        if not forwarded:
            for event in answer.opening():
                yield event
        while type(item) is Delta:
            if forwarded:
                if item.chunk is not None:
                    yield _own_event(answer, kept.req, item.chunk)
            elif item.text and item.index == 0:
                yield answer.delta(item.text)
            text += item.text
            item = await ticket.next()
    except RequestError as exc:  # after the stream began: an error event, then response.failed
        exc = _worded(exc)
        ended = True
        if kept.cancelled:
            await kept.unfinished(answer, "cancelled", None, text)
            return
        await kept.unfinished(
            answer, "failed", {"code": failure_code(exc.code), "message": exc.message}, text
        )
        for event in answer.failure(exc.code, exc.message, exc.param, text, extension(ticket)):
            yield event
        return
    finally:
        if not ended and type(item) is Delta:  # (closed part-way: its client went away)
            await kept.unfinished(answer, "cancelled", None, text)
    assert type(item) is Done
    final = await kept.final(answer, item, ticket)
    if kept.req.store and not final["store"] and not kept.deleted:  # (not a deletion: an outage)
        yield answer.event(
            "error", code="store_unavailable", message="the response could not be stored", param="store"
        )
    if forwarded and item.chunks:  # the upstream's last event, with the finished response
        last = dict(item.chunks[-1])
        last["response"] = final  # (laneway's already, whether it is stored now included)
        yield event_sse(last)
    else:
        for event in answer.closing(final):
            yield event


def _own_event(answer: Answer, req: ResponsesRequest, event: dict[str, Any]) -> bytes:
    """An upstream's event as sent, but for laneway's id on the response it carries; numbered
    on from the upstream's count (so that an event laneway adds follows in order)."""
    response = event.get("response")
    if isinstance(response, dict):
        own(req, response)
    seq = event.get("sequence_number")
    if isinstance(seq, int) and not isinstance(seq, bool):
        answer.seq = seq + 1
    return event_sse(event)


async def retrieve(request: Request) -> Response:
    owner = tenant_of(request, request.app.state.runtime.config)
    if request.query_params.get("stream", "false").lower() not in ("false", "0"):
        # (OpenAI streams a background response's events again: laneway runs none in the
        # background, and a stored response has finished)
        raise InvalidRequest("stream is not served here: a stored response comes whole", param="stream")
    include = [v for key in ("include", "include[]") for v in request.query_params.getlist(key) if v]
    if include:  # (as when it was made: nothing more than its text is kept)
        raise InvalidRequest(
            f"include is not served here (got {include[0]!r}): a stored response is its text", param="include"
        )
    record = await _record(request, owner)
    return JSON(record["response"])


async def _record(request: Request, owner: str) -> dict[str, Any]:
    try:
        return await record_of(request.app.state.store, request.path_params["response_id"], owner)
    except NotFound as exc:
        raise maybe_lost(request, exc) from None


async def delete(request: Request) -> Response:
    owner = tenant_of(request, request.app.state.runtime.config)
    response_id = request.path_params["response_id"]
    if not await request.app.state.store.delete_response(response_id, owner):
        raise NotFound(f"no response with id {response_id!r}")
    return JSON({"id": response_id, "object": "response", "deleted": True})


async def input_items(request: Request) -> Response:
    owner = tenant_of(request, request.app.state.runtime.config)
    record = await _record(request, owner)
    query = request.query_params
    limit = limit_param(query, MAX_ITEMS_PAGE)
    order = order_param(query)
    items: list[dict[str, Any]] = record["input_items"]
    if order == "desc":
        items = items[::-1]
    after = after_param(query)
    if after is not None:
        ids = [i["id"] for i in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    return JSON(page(items[:limit], len(items) > limit, lambda item: item))


@_in_its_words
async def input_tokens(request: Request) -> Response:
    """``POST /v1/responses/input_tokens``: how many tokens the input of a response made of
    this body would take: counted here by the model's own tokenizer and chat template for an
    engine of laneway's (what ``usage.input_tokens`` of that response says); for an upstream's
    model, asked of the upstream (its conversation so far put before its input, as a response
    is sent), which answers as it does."""
    runtime: Runtime = request.app.state.runtime
    config = runtime.config
    tenant = authenticate(request, config)
    body, size = await read_json_sized(request, config.max_body_bytes)
    request.state.sent = frozenset(body)  # (the fields its errors may name as they are)
    model, served = model_of(body, runtime.support, config.aliases)
    req = read_responses(body, engine=not served.passthrough)
    context = await _context(request, req, tenant.name if tenant is not None else "")
    if served.passthrough:
        asked = {k: v for k, v in body.items() if k != "previous_response_id"}
        if context:
            asked["input"] = [*context, *req.input_list]
        return await passed_on(request, runtime, tenant, model, "responses/input_tokens", asked, size)
    priority(body, request.headers, tenant, config)  # (checked as on any endpoint: nothing is queued)
    preemptibleflag(body)
    job = parse_request(chat_body(req, context), CHAT, config, runtime.support).job
    engines = [w.engine for name, w in runtime.workers.items() if runtime.served.get(name, name) == model]
    counter = next((e for e in engines if isinstance(e, Tokenizes)), None)
    if counter is None:
        raise InvalidRequest(
            f"model {model!r} is served by {served.engine}, which has no tokenizer: "
            "its input tokens cannot be counted",
            param="model",
        )
    return JSON({"object": "response.input_tokens", "input_tokens": len(counter.tokenize(job))})


@runtime_checkable
class Tokenizes(Protocol):
    """An engine that tokenizes a job's prompt as it would run it."""

    def tokenize(self, job: Job) -> list[int]: ...
