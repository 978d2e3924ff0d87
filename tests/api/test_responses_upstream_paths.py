"""The Responses API's paths beside a response's id, for an upstream's model: ``POST
/v1/responses/input_tokens`` and ``/v1/responses/compact`` are the upstream's to answer
(passed on as any other request for it), the conversation laneway keeps put before the input
as a response that continues it is sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from laneway.config import ServerConfig
from live_server import live_server, serving, upstream


def _sse(kind: str, **fields: Any) -> str:
    return f"data: {json.dumps({'type': kind, **fields})}\n\n"


def fake_upstream(asked: list[tuple[str, dict[str, Any]]]) -> Starlette:
    """An engine of model ``m`` with a Responses API (always ``"ok"``), an input count (a
    token per word of a text input, per item of a list) and a compaction; what each POST got
    goes in ``asked``."""

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def responses(request: Request) -> Response:
        body = await request.json()
        asked.append(("responses", body))
        final = {
            "id": "resp_up",
            "object": "response",
            "status": "completed",
            "model": "m",
            "store": body.get("store", True),  # (as it was asked: laneway asks for false)
            "output": [
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "ok", "annotations": []}],
                }
            ],
            "usage": {"input_tokens": 2, "output_tokens": 1, "total_tokens": 3},
        }
        events = [
            _sse("response.created", response={**final, "status": "in_progress", "output": []}),
            _sse("response.output_text.delta", delta="ok"),
            _sse("response.completed", response=final),
        ]
        if body.get("input") != "slow":
            return Response("".join(events), media_type="text/event-stream")

        async def slowly() -> AsyncIterator[str]:  # (its first event, then the rest 0.5 s later)
            yield events[0]
            await asyncio.sleep(0.5)
            yield "".join(events[1:])

        return StreamingResponse(slowly(), media_type="text/event-stream")

    async def input_tokens(request: Request) -> Response:
        body = await request.json()
        asked.append(("input_tokens", body))
        given = body["input"]
        count = len(given) if isinstance(given, list) else len(given.split())
        return JSONResponse({"object": "response.input_tokens", "input_tokens": count})

    async def compact(request: Request) -> Response:
        asked.append(("compact", await request.json()))
        return JSONResponse({"id": "resp_c", "object": "response.compaction", "output": []})

    return Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/responses", responses, methods=["POST"]),
            Route("/v1/responses/input_tokens", input_tokens, methods=["POST"]),
            Route("/v1/responses/compact", compact, methods=["POST"]),
        ]
    )


def test_input_tokens_and_compaction_of_an_upstreams_model_are_the_upstreams(tmp_path: Path) -> None:
    asked: list[tuple[str, dict[str, Any]]] = []
    with serving(fake_upstream(asked)) as url:
        cfg = replace(ServerConfig(), workers=(upstream("u", url),), data_dir=tmp_path)
        with live_server(cfg) as s:
            c = openai.OpenAI(base_url=s.base_url, api_key="unused", max_retries=0, timeout=60)
            with c:
                counted = c.responses.input_tokens.count(model="m", input="one two three")
                assert (counted.object, counted.input_tokens) == ("response.input_tokens", 3)
                assert asked[-1] == ("input_tokens", {"model": "m", "input": "one two three"})
                first = c.responses.create(model="m", input="four five")
                assert first.output_text == "ok"
                # a count that continues it: the conversation laneway keeps goes first, as the
                # response that continues it would be sent; laneway's own field is not passed on
                counted = c.responses.input_tokens.count(
                    model="m", input="six", previous_response_id=first.id
                )
                sent = asked[-1][1]
                assert asked[-1][0] == "input_tokens" and "previous_response_id" not in sent
                assert sent["input"][0]["content"] == "four five"
                assert sent["input"][-1] == {"role": "user", "content": "six"}
                assert counted.input_tokens == 3  # (the upstream's count: its three items)
                r = httpx.post(f"{s.base_url}/responses/compact", json={"model": "m", "input": "x"})
                assert r.status_code == 200 and r.json()["object"] == "response.compaction", r.text
                assert asked[-1] == ("compact", {"model": "m", "input": "x"})
                # an unknown previous response is laneway's to refuse: nothing is sent
                n = len(asked)
                r = httpx.post(
                    f"{s.base_url}/responses/input_tokens",
                    json={"model": "m", "input": "x", "previous_response_id": "resp_nope"},
                    timeout=30,
                )
                assert r.status_code == 400 and r.json()["error"]["param"] == "previous_response_id"
                assert len(asked) == n


def test_an_upstreams_response_carries_the_name_its_client_used(tmp_path: Path) -> None:
    """(the upstream serves ``m``; laneway serves it as ``mine``: whole, streamed, read back)"""
    asked: list[tuple[str, dict[str, Any]]] = []
    with serving(fake_upstream(asked)) as url:
        worker = upstream("u", url, model="m", served_name="mine")
        cfg = replace(ServerConfig(), workers=(worker,), data_dir=tmp_path)
        with live_server(cfg) as s:
            c = openai.OpenAI(base_url=s.base_url, api_key="unused", max_retries=0, timeout=60)
            with c:
                whole = c.responses.create(model="mine", input="four five")
                assert asked[-1][0] == "responses" and asked[-1][1]["model"] == "m"
                assert (whole.model, whole.output_text) == ("mine", "ok")
                events = list(c.responses.create(model="mine", input="six", stream=True))
                carried = [e.response for e in events if hasattr(e, "response")]  # type: ignore[union-attr]
                assert carried and {r.model for r in carried} == {"mine"}
                assert asked[-1][1]["store"] is False  # (laneway stores it, as the client asked)
                assert {r.store for r in carried} == {True}
                assert c.responses.retrieve(whole.id).model == "mine"
                # deleted while it streams: it stays deleted, its stream's end says "store": false
                body = {"model": "mine", "input": "slow", "stream": True}
                with httpx.stream("POST", s.base_url + "/responses", json=body, timeout=60) as r:
                    lines = r.iter_lines()
                    first = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
                    c.responses.delete(first["response"]["id"])
                    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
                assert events[-1]["type"] == "response.completed"
                assert events[-1]["response"]["store"] is False, events[-1]
                sent = len(asked)  # background: not served (refused here, naming it, and not sent:
                with pytest.raises(openai.BadRequestError, match="background is not served") as err:
                    c.responses.create(model="mine", input="x", background=True)  # vLLM's refusal misled)
                assert err.value.body["param"] == "background" and len(asked) == sent  # type: ignore[index]
