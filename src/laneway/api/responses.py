"""The Responses API: ``POST /v1/responses`` (streamed and not), ``GET`` and ``DELETE
/v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``.

A response is served from the chat path (:mod:`laneway.protocol.responses_api`):
it is queued, classed, preempted and resumed as a chat request is. A response
made with ``store`` (the default) is kept in laneway's store (SQLite, or Redis
for replicas) under its tenant: only that tenant's key reads, continues
(``previous_response_id``) or deletes it; to another tenant it does not exist.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from laneway.api.completions import JSON, first_event
from laneway.api.params import authenticate, priority, read_json_sized
from laneway.api.streaming import EventStream
from laneway.errors import InvalidRequest, NotFound, RequestError
from laneway.generation import CHAT, Delta, Done
from laneway.protocol.requests import parse_request
from laneway.protocol.responses import extension
from laneway.protocol.responses_api import Answer, ResponsesRequest, chat_body, context_after, read_responses
from laneway.runtime import Runtime, Ticket
from laneway.store import Store, StoreUnavailable

log = logging.getLogger("laneway.api")
MAX_ITEMS_PAGE = 100


def _owner(request: Request, runtime: Runtime) -> str:
    tenant = authenticate(request, runtime.config)
    return tenant.name if tenant is not None else ""


async def _record(store: Store, response_id: str, owner: str, param: str | None = None) -> dict[str, Any]:
    raw = await store.get_response(response_id, owner)
    if raw is None:
        raise NotFound(f"no response with id {response_id!r}", param=param)
    record: dict[str, Any] = json.loads(raw)
    return record


async def create(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    store: Store = request.app.state.store
    config = runtime.config
    tenant = authenticate(request, config)
    owner = tenant.name if tenant is not None else ""
    body, size = await read_json_sized(request, config.max_body_bytes)
    req = read_responses(body)
    context: list[dict[str, str]] = []
    if req.previous_response_id is not None:
        try:
            context = (await _record(store, req.previous_response_id, owner))["context"]
        except NotFound:
            raise InvalidRequest(
                f"previous response with id {req.previous_response_id!r} not found",
                param="previous_response_id",
            ) from None
    parsed = parse_request(chat_body(req, context), CHAT, config, runtime.support)
    ticket = runtime.submit(
        parsed.job,
        priority(body, request.headers, tenant, config),
        tenant=tenant.name if tenant is not None else None,
        preemptible=parsed.preemptible,
        deltas=req.stream,
        size=size,
    )
    answer = Answer(req, parsed.job.model, int(time.time()), body.get("service_tier"))
    first = await first_event(request, runtime, ticket, req.stream)
    if isinstance(first, Response):
        return first
    if not req.stream:
        assert type(first) is Done
        final = _final(answer, first, ticket)
        final["store"] = await _keep(store, owner, req, context, final)
        return JSON(final)
    return EventStream(_events(store, owner, answer, ticket, first, context), lambda: runtime.cancel(ticket))


def _final(answer: Answer, done: Done, ticket: Ticket) -> dict[str, Any]:
    return answer.response(
        "completed",
        text=done.text,
        usage=done.usage,
        finish=done.finish_reason,
        completed_at=int(time.time()),
        ext=extension(ticket),
    )


async def _keep(
    store: Store, owner: str, req: ResponsesRequest, context: list[dict[str, str]], final: dict[str, Any]
) -> bool:
    """Store a finished response (``store`` asked); whether it is stored. A store that cannot
    be reached does not cost the client its answer: it is sent, marked ``store: false``."""
    if not req.store:
        return False
    text = final["output"][0]["content"][0]["text"] if final["output"] else ""
    record = {
        "response": final,
        "input_items": list(req.input_items),
        "context": context_after(req, context, text),
    }
    try:
        await store.put_response(req.id, owner, final["created_at"], json.dumps(record, ensure_ascii=False))
    except StoreUnavailable as exc:
        log.warning("response %s not stored: %s", req.id, exc)
        return False
    return True


async def _events(
    store: Store,
    owner: str,
    answer: Answer,
    ticket: Ticket,
    first: Delta | Done,
    context: list[dict[str, str]],
) -> AsyncIterator[bytes]:
    for event in answer.opening():
        yield event
    item: Delta | Done = first
    text = ""
    try:
        while type(item) is Delta:
            if item.text and item.index == 0:
                text += item.text
                yield answer.delta(item.text)
            item = await ticket.next()
    except RequestError as exc:  # after the stream began: an error event, then response.failed
        for event in answer.failure(exc.code, exc.message, exc.param, text):
            yield event
        return
    assert type(item) is Done
    final = _final(answer, item, ticket)
    stored = await _keep(store, owner, answer.req, context, final)
    if answer.req.store and not stored:
        yield answer.event(
            "error", code="store_unavailable", message="the response could not be stored", param="store"
        )
    final["store"] = stored
    for event in answer.closing(final):
        yield event


async def retrieve(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    owner = _owner(request, runtime)
    record = await _record(request.app.state.store, request.path_params["response_id"], owner)
    return JSON(record["response"])


async def delete(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    owner = _owner(request, runtime)
    response_id = request.path_params["response_id"]
    if not await request.app.state.store.delete_response(response_id, owner):
        raise NotFound(f"no response with id {response_id!r}")
    return JSON({"id": response_id, "object": "response", "deleted": True})


async def input_items(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    owner = _owner(request, runtime)
    record = await _record(request.app.state.store, request.path_params["response_id"], owner)
    query = request.query_params
    raw_limit = query.get("limit", "20")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_ITEMS_PAGE:
        raise InvalidRequest(f"limit must be a whole number from 1 to {MAX_ITEMS_PAGE}", param="limit")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be asc or desc", param="order")
    items: list[dict[str, Any]] = record["input_items"]
    if order == "desc":
        items = items[::-1]
    after = query.get("after")
    if after is not None:
        ids = [i["id"] for i in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[: int(raw_limit)]
    return JSON(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > len(page),
        }
    )
