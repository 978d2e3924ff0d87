"""Responses kept in laneway's store (``store``, the default): a finished one whole, with the
conversation it continues; a streamed one from its first event, ``in_progress``.

A response stored in progress holds a lease (:data:`LEASE_S`), renewed while its stream
runs (:data:`RENEW_S`), however long it waits (a preempted request may queue for minutes):
one whose lease ran out was being answered by a server that stopped (a crash, a
``kill -9``) before it could say how it ended; it reads as ``failed``, and cannot be
continued — as on any server of a cluster, where the one that answered it may be another.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from laneway.errors import NotFound
from laneway.generation import Done
from laneway.protocol.responses import extension
from laneway.protocol.responses_answer import Answer
from laneway.protocol.responses_api import ResponsesRequest, context_after
from laneway.runtime import Ticket
from laneway.store import Store, StoreUnavailable

log = logging.getLogger("laneway.api")
LEASE_S = 60.0  # a response stored in progress is taken for failed this long after its last renewal
RENEW_S = 15.0  # its stream renews it this often
STOPPED = {
    "code": "server_error",
    "message": "the server answering it stopped before the response was done",
}


async def record_of(store: Store, response_id: str, owner: str, param: str | None = None) -> dict[str, Any]:
    """The stored record of a response (``response``, ``input_items``, ``context``); one in
    progress whose lease ran out reads as failed."""
    raw = await store.get_response(response_id, owner)
    if raw is None:
        raise NotFound(f"no response with id {response_id!r}", param=param)
    record: dict[str, Any] = json.loads(raw)
    response = record["response"]
    if response.get("status") == "in_progress" and record.get("lease_until", 0.0) < time.time():
        record["response"] = {**response, "status": "failed", "error": dict(STOPPED)}
    return record


class Kept:
    """Where a finished response is stored (``store`` asked): its tenant, its conversation."""

    def __init__(
        self,
        store: Store,
        owner: str,
        req: ResponsesRequest,
        context: list[dict[str, Any]],
        *,
        forwarded: bool,
    ) -> None:
        self.store, self.owner, self.req, self.context = store, owner, req, context
        self.forwarded = forwarded  # answered by an upstream's Responses API (its own objects)
        self.begun = False  # a stream's response is stored in progress (it can be retrieved so)
        self.cancelled = False  # its client went away
        self.deleted = False  # its client deleted it while it streamed: it stays deleted
        self._renewing: asyncio.Task[None] | None = None

    async def begin(self, answer: Answer) -> None:
        """A stream began: its response is stored ``in_progress`` (as OpenAI shows one), with
        no conversation to continue yet, its lease renewed until it ends."""
        if self.req.store:
            self.begun = await self._put(answer.response("in_progress"), None, lease=True)
            if self.begun:
                self._renewing = asyncio.get_running_loop().create_task(self._renew(answer))

    async def _renew(self, answer: Answer) -> None:
        while True:
            await asyncio.sleep(RENEW_S)
            if not await self._still_there():
                return
            await self._put(answer.response("in_progress"), None, lease=True)

    async def ended(self) -> None:
        """Its stream ended (however): its lease is renewed no more."""
        task, self._renewing = self._renewing, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def unfinished(self, answer: Answer, status: str, error: dict[str, str] | None, text: str) -> None:
        """A stream that began ended without its answer (``failed``, ``cancelled``): its stored
        response says so, and cannot be continued."""
        await self.ended()
        if self.begun and await self._still_there():
            await self._put(answer.response(status, text=text or None, error=error), None)

    async def final(self, answer: Answer, done: Done, ticket: Ticket) -> dict[str, Any]:
        """The finished response (the upstream's own, or one made from ``done``), stored."""
        await self.ended()
        final = answer.finished(done, extension(ticket), forwarded=self.forwarded, now=int(time.time()))
        final["store"] = self.req.store  # (as it is kept: read back, it says so too)
        final["store"] = await self._keep(final)
        return final

    async def _keep(self, final: dict[str, Any]) -> bool:
        """Whether it is stored. A store that cannot be reached does not cost the client its
        answer: it is sent, marked ``store: false``."""
        req = self.req
        if not req.store:
            return False
        if self.begun and not await self._still_there():
            self.deleted = True
            return False
        output = final.get("output")
        return await self._put(
            final, context_after(req, self.context, output if isinstance(output, list) else [])
        )

    async def _still_there(self) -> bool:
        """Whether the response stored in progress is still stored (its client may have
        deleted it meanwhile: it stays deleted)."""
        try:
            return await self.store.get_response(self.req.id, self.owner) is not None
        except StoreUnavailable:
            return True

    async def _put(
        self, response: dict[str, Any], context: list[dict[str, Any]] | None, *, lease: bool = False
    ) -> bool:
        req = self.req
        record: dict[str, Any] = {
            "response": response,
            "input_items": list(req.input_items),
            "context": context,
        }
        if lease:
            record["lease_until"] = time.time() + LEASE_S
        created = response.get("created_at")
        try:
            await self.store.put_response(
                req.id,
                self.owner,
                int(created) if isinstance(created, int | float) else int(time.time()),
                json.dumps(record, ensure_ascii=False),
            )
        except StoreUnavailable as exc:
            log.warning("response %s not stored: %s", req.id, exc)
            return False
        return True
