"""The Responses API on the built-in engine (builtin:tiny), through the official openai client.

A response is the chat request its input makes (the same greedy text and usage);
``previous_response_id`` continues the stored conversation (its instructions not
carried over); the stream's events are OpenAI's, in order, numbered; stored
responses are read, listed, deleted and continued only by their own tenant; a P0
response preempts a P3 one, which resumes to the same text.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from laneway.api import stored_responses
from laneway.backends.simulated import SimulatedWorker
from laneway.config import ServerConfig, hash_key, parse_config
from laneway.errors import BackendError
from laneway.generation import Delta, Failed
from live_server import LiveServer, live_server, overtaken, sim_config, tiny
from openapi_subset import SAID_BACK

MODEL = "builtin:tiny"
ALICE, BOB = "alice-key", "bob-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    cfg = replace(ServerConfig(), workers=(tiny(2),), data_dir=tmp_path_factory.mktemp("responses"))
    with live_server(cfg) as s:
        yield s


_clients: list[openai.OpenAI] = []


def client(s: LiveServer, key: str = "unused") -> openai.OpenAI:
    """A client of ``s``, closed as the test ends (left to the collector, its kept-alive
    connection would be reported unclosed in whichever test ran then)."""
    c = openai.OpenAI(base_url=s.base_url, api_key=key, max_retries=0, timeout=120)
    _clients.append(c)
    return c


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _clients:
        _clients.pop().close()


def chat_text(c: openai.OpenAI, messages: list[dict[str, str]], tokens: int) -> tuple[str, Any]:
    r = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=tokens, temperature=0)  # type: ignore[arg-type]
    return r.choices[0].message.content or "", r.usage


def test_a_response_is_its_chat_request_and_continues_a_stored_one(server: LiveServer) -> None:
    c = client(server)
    first = c.responses.create(
        model=MODEL, input="Hello", instructions="be brief", max_output_tokens=12, temperature=0
    )
    text, usage = chat_text(
        c, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hello"}], 12
    )
    assert first.id.startswith("resp_") and first.object == "response"
    assert first.output_text == text and first.output[0].content[0].text == text  # type: ignore[union-attr]
    assert first.usage is not None
    assert (first.usage.input_tokens, first.usage.output_tokens) == (
        usage.prompt_tokens,
        usage.completion_tokens,
    )
    assert first.status in ("completed", "incomplete") and first.instructions == "be brief"
    if first.status == "incomplete":  # (the tiny model rarely stops by itself)
        assert first.incomplete_details is not None
        assert first.incomplete_details.reason == "max_output_tokens"
    ext = first.model_extra["laneway"]  # type: ignore[index]
    assert ext["priority"] == "P1" and ext["preemptions"] == 0  # (the default class)
    second = c.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "again"}]}],
        previous_response_id=first.id,
        max_output_tokens=8,
        temperature=0,
    )
    # the conversation so far, without the first turn's instructions (as OpenAI does)
    history = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": text},
        {"role": "user", "content": "again"},
    ]
    assert second.previous_response_id == first.id
    assert second.output_text == chat_text(c, history, 8)[0]
    third = c.responses.create(
        model=MODEL, input="more", previous_response_id=second.id, max_output_tokens=6, temperature=0
    )
    history += [{"role": "assistant", "content": second.output_text}, {"role": "user", "content": "more"}]
    assert third.output_text == chat_text(c, history, 6)[0]


def test_the_stream_is_openais_events_in_order(server: LiveServer) -> None:
    c = client(server)
    whole = c.responses.create(model=MODEL, input="Hi there", max_output_tokens=10, temperature=0)
    events = list(
        c.responses.create(model=MODEL, input="Hi there", max_output_tokens=10, temperature=0, stream=True)
    )
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    end = "response.completed" if whole.status == "completed" else "response.incomplete"
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        end,
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert deltas and "".join(d.delta for d in deltas) == whole.output_text
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == whole.output_text and final.status == whole.status
    assert final.model_extra["laneway"]["priority"] == "P1"
    assert c.responses.retrieve(final.id).output_text == whole.output_text  # a streamed one is stored too
    created = events[0].response  # type: ignore[union-attr]
    assert created.status == "in_progress" and created.output == [] and created.id == final.id


def _created(lines: Iterator[str]) -> str:
    """The id of the response a stream (its SSE lines) begins."""
    for line in lines:
        if line.startswith("data: "):
            event = json.loads(line[6:])
            assert event["type"] == "response.created", event
            return str(event["response"]["id"])
    raise AssertionError("the stream ended before response.created")


def _status(c: openai.OpenAI, response_id: str, want: str) -> str:
    status = ""
    for _ in range(100):  # (its end is stored as the stream closes)
        status = c.responses.retrieve(response_id).status or ""
        if status == want:
            break
        time.sleep(0.05)
    return status


def test_a_streaming_response_is_stored_in_progress_then_as_it_ended(tmp_path: Path) -> None:
    with live_server(sim_config(tmp_path, tokens_per_s=50)) as server:  # (a pace to catch it streaming)
        _stream_stored_as_it_goes(server)


class BreaksPartWay(SimulatedWorker):
    """Streams three words, then its engine breaks."""

    async def _generate(self, run: Any) -> None:
        for i in range(3):
            run.done += 1
            run.sink(Delta(run.job.id, f"w{i} ", run.done))
            await asyncio.sleep(0.01)
        self._runs.pop(run.job.id, None)
        run.sink(Failed(run.job.id, BackendError("the engine broke")))


def test_a_streaming_response_that_fails_is_stored_failed(tmp_path: Path) -> None:
    with (
        live_server(sim_config(tmp_path), {"sim0": BreaksPartWay("sim0", "sim", 2)}) as server,
        client(server) as c,
    ):
        events = list(c.responses.create(model="sim", input="x", max_output_tokens=20, stream=True))
        assert [e.type for e in events][-2:] == ["error", "response.failed"]
        ext = events[-1].response.model_extra["laneway"]  # type: ignore[union-attr]  # (as a last event's has)
        assert ext["priority"] and ext["worker"] == "sim0", ext
        got = c.responses.retrieve(events[0].response.id)  # type: ignore[union-attr]
        assert got.status == "failed" and got.error is not None and got.error.code == "server_error", got
        assert got.output_text == "w0 w1 w2 "  # (what it made before it failed)
        with pytest.raises(openai.BadRequestError, match="is failed"):
            c.responses.create(model="sim", input="and then?", previous_response_id=got.id)


def _stream_stored_as_it_goes(server: LiveServer) -> None:
    body = {"model": "sim", "input": "Tell a long story", "max_output_tokens": 400, "stream": True}
    with client(server) as c, httpx.Client(base_url=server.base_url, timeout=60) as http:
        with http.stream("POST", "/responses", json=body) as r:
            lines = r.iter_lines()  # (held: dropped, it would close the stream)
            rid = _created(lines)
            got = c.responses.retrieve(rid)  # as OpenAI shows one: there, in progress
            assert got.status == "in_progress" and got.output == [], got
            with pytest.raises(openai.BadRequestError, match="in_progress"):  # nothing to go on from yet
                c.responses.create(model="sim", input="and then?", previous_response_id=rid)
        # the client left part-way: the request is cancelled, and its response says so
        assert _status(c, rid, "cancelled") == "cancelled"
        with pytest.raises(openai.BadRequestError, match="cancelled"):
            c.responses.create(model="sim", input="and then?", previous_response_id=rid)
        with http.stream("POST", "/responses", json={**body, "max_output_tokens": 20}) as r:
            lines = r.iter_lines()
            rid = _created(lines)
            c.responses.delete(rid)  # deleted while it streams: it stays deleted
            events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
        final = events[-1]["response"]
        assert final["status"] in ("completed", "incomplete") and final["store"] is False, final
        assert "error" not in [e["type"] for e in events]  # (a deletion, not a store outage)
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(rid)


def test_a_response_streaming_holds_a_lease_and_one_a_stopped_server_left_reads_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server killed mid-stream (``kill -9``) cannot store how its response ended: the
    record it left in progress holds a lease that its stream renewed; once that ran out, it
    reads as failed, and cannot be continued."""
    monkeypatch.setattr(stored_responses, "LEASE_S", 0.4)
    monkeypatch.setattr(stored_responses, "RENEW_S", 0.1)
    body = {"model": "sim", "input": "Tell a story", "max_output_tokens": 30, "stream": True}
    with (
        live_server(sim_config(tmp_path, tokens_per_s=20)) as server,  # (30 tokens: 1.5 s)
        client(server) as c,
        httpx.Client(base_url=server.base_url) as http,
    ):
        with http.stream("POST", "/responses", json=body) as r:
            lines = r.iter_lines()
            rid = _created(lines)
            time.sleep(0.8)  # (twice its lease: renewed meanwhile)
            assert c.responses.retrieve(rid).status == "in_progress"
            for _ in lines:
                pass
        assert _status(c, rid, "incomplete") == "incomplete"
        # its server stops writing once the response is stored in progress (as if killed then)
        put = stored_responses.Kept._put
        begun: set[int] = set()

        async def first_only(kept: stored_responses.Kept, *args: Any, **kw: Any) -> bool:
            if id(kept) in begun:
                return True
            begun.add(id(kept))
            return await put(kept, *args, **kw)

        monkeypatch.setattr(stored_responses.Kept, "_put", first_only)
        with http.stream("POST", "/responses", json=body) as r:
            lines = r.iter_lines()
            rid = _created(lines)
            for _ in lines:
                pass
        time.sleep(0.5)  # (its lease, not renewed, ran out)
        got = c.responses.retrieve(rid)
        assert got.status == "failed" and got.error is not None and got.error.code == "server_error", got
        assert "stopped before the response was done" in got.error.message
        with pytest.raises(openai.BadRequestError, match="is failed"):
            c.responses.create(model="sim", input="and then?", previous_response_id=rid)


def test_stored_responses_are_read_listed_and_deleted(server: LiveServer) -> None:
    c = client(server)
    items = [
        {"role": "developer", "content": "answer in French"},
        {"role": "user", "content": "one"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "un"}]},
        {"role": "user", "content": "two"},
    ]
    r = c.responses.create(model=MODEL, input=items, max_output_tokens=4, metadata={"k": "v"})  # type: ignore[arg-type]
    got = c.responses.retrieve(r.id)
    url = f"{server.base_url}/responses/{r.id}"
    assert httpx.get(url, params={"stream": "false"}, timeout=30).json()["id"] == r.id
    again = httpx.get(url, params={"stream": "true"}, timeout=30)  # (not ignored: refused)
    assert again.status_code == 400 and again.json()["error"]["param"] == "stream", again.text
    assert got.id == r.id and got.output_text == r.output_text and got.metadata == {"k": "v"}
    listed = list(c.responses.input_items.list(r.id, order="asc"))
    assert [(i.role, i.content[0].text) for i in listed] == [  # type: ignore[union-attr]
        ("developer", "answer in French"),
        ("user", "one"),
        ("assistant", "un"),
        ("user", "two"),
    ]
    newest_first = c.responses.input_items.list(r.id, limit=3)
    assert [i.id for i in newest_first.data] == [i.id for i in listed[::-1][:3]]
    assert newest_first.has_more and newest_first.first_id == listed[-1].id
    after = c.responses.input_items.list(r.id, order="asc", after=listed[1].id)
    assert [i.id for i in after.data] == [i.id for i in listed[2:]] and not after.has_more
    c.responses.delete(r.id)
    for call in (lambda: c.responses.retrieve(r.id), lambda: c.responses.delete(r.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError, match="previous response"):
        c.responses.create(model=MODEL, input="x", previous_response_id=r.id)
    unstored = c.responses.create(model=MODEL, input="x", max_output_tokens=2, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(unstored.id)


def test_input_tokens_are_what_the_response_would_take_counted_by_the_models_tokenizer(
    server: LiveServer,
) -> None:
    c = client(server)
    ask: dict[str, Any] = {"model": MODEL, "input": "Hello there", "instructions": "be brief"}
    first = c.responses.create(**ask, max_output_tokens=3, temperature=0)
    counted = c.responses.input_tokens.count(**ask)
    assert counted.object == "response.input_tokens"
    assert first.usage is not None and counted.input_tokens == first.usage.input_tokens
    # continuing a stored conversation counts it too, as the response that continues it does
    more: dict[str, Any] = {"model": MODEL, "input": "and more", "previous_response_id": first.id}
    counted = c.responses.input_tokens.count(**more)
    second = c.responses.create(**more, max_output_tokens=3, temperature=0)
    assert second.usage is not None and counted.input_tokens == second.usage.input_tokens
    assert counted.input_tokens > first.usage.input_tokens
    url = server.base_url + "/responses/input_tokens"
    for body, param in [
        ({"input": "x"}, "model"),
        ({"model": MODEL, "input": "x", "previous_response_id": "resp_none"}, "previous_response_id"),
        ({"model": MODEL, "input": "x", "tools": [{"type": "function", "name": "f"}]}, "tools"),
        ({"model": MODEL, "input": [{"role": "user", "content": 5}]}, "input[0]"),
    ]:
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, (body, r.text)
    # the path is not a response's id; compaction is an upstream's to serve (none here)
    r = httpx.get(url, timeout=30)
    assert r.status_code == 404 and "no response with id 'input_tokens'" in r.json()["error"]["message"]
    r = httpx.post(server.base_url + "/responses/compact", json={"model": MODEL, "input": "x"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error", r.text


def test_what_is_not_served_is_refused_naming_the_field(server: LiveServer) -> None:
    url = server.base_url + "/responses"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"input": "x"}, "model"),
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": []}, "input"),
        ({"model": MODEL, "input": "x", "tools": [{"type": "function", "name": "f"}]}, "tools"),
        ({"model": MODEL, "input": "x", "text": {"format": {"type": "json_object"}}}, "text"),
        ({"model": MODEL, "input": "x", "reasoning": {"effort": "high"}}, "reasoning"),
        ({"model": MODEL, "input": "x", "background": True}, "background"),
        ({"model": MODEL, "input": "x", "frobnicate": 1}, "frobnicate"),
        (
            {"model": MODEL, "input": [{"type": "input_image", "image_url": "http://127.0.0.1/x.png"}]},
            "input[0]",
        ),
        (
            {"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_file"}]}]},
            "input[0].content[0]",
        ),
        ({"model": MODEL, "input": [{"role": "tool", "content": "x"}]}, "input[0]"),
        ({"model": MODEL, "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": MODEL, "input": "x", "temperature": 3}, "temperature"),
        ({"model": MODEL, "input": "x", "metadata": {"k": 1}}, "metadata"),
        ({"model": MODEL, "input": "x", "store": "yes"}, "store"),
        ({"model": MODEL, "input": "x", "previous_response_id": 5}, "previous_response_id"),
        ({"model": MODEL, "input": "x", "priority": "P9"}, "priority"),
        ({"model": MODEL, "input": "x", "truncation": "auto"}, "truncation"),  # (it would drop items)
        # fields of the spec taken only of their type
        ({"model": MODEL, "input": "x", "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"model": MODEL, "input": "x", "safety_identifier": 5}, "safety_identifier"),
        ({"model": MODEL, "input": "x", "prompt_cache_key": ["a"]}, "prompt_cache_key"),
        ({"model": MODEL, "input": "x", "prompt_cache_key": "k" * 65}, "prompt_cache_key"),
        ({"model": MODEL, "input": "x", "stream_options": 5}, "stream_options"),
        (
            {"model": MODEL, "input": "x", "text": {"format": {"type": "text"}, "verbosity": 5}},
            "text.verbosity",
        ),
        # the chat path's errors in the Responses API's words
        ({"model": MODEL, "input": "x", "max_output_tokens": 100_000}, "max_output_tokens"),
        ({"model": MODEL, "input": "x " * 5000}, "input"),
    ]
    for body, param in cases:
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == 400, (body, r.text)
        error = r.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"], body
        assert "max_tokens" not in error["message"], error  # (a chat field the client did not send)
    # chat fields the client did send are refused naming them, as sent
    for field, value in (("max_tokens", 5), ("max_completion_tokens", 5), ("messages", [])):
        r = httpx.post(url, json={"model": MODEL, "input": "x", field: value}, timeout=30)
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == field, r.text
        assert error["message"].startswith(field) and "max_output_tokens" not in error["message"], r.text
    r = httpx.post(url, json={"model": "nope", "input": "x"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(url, content=b"{", headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400
    # what asks for nothing more than text is taken
    plain = {
        "model": MODEL,
        "input": "x",
        "max_output_tokens": 2,
        "tools": [],
        "tool_choice": "auto",
        "text": {"format": {"type": "text"}},
        "reasoning": {"effort": None},
        "truncation": "disabled",
        "parallel_tool_calls": True,
        "include": [],
    }
    assert httpx.post(url, json=plain, timeout=30).status_code == 200
    # what it took is said back as given (the spec's Response has each)
    said = SAID_BACK
    r = httpx.post(url, json={**plain, **said, "text": {"verbosity": "low"}}, timeout=30)
    stored = httpx.get(f"{url}/{r.json()['id']}", timeout=30)
    for got in (r.json(), stored.json()):
        assert {k: got.get(k) for k in said} == said, got
        assert got["text"] == {"format": {"type": "text"}, "verbosity": "low"}, got
    rid = httpx.post(url, json={"model": MODEL, "input": "x", "max_output_tokens": 2}, timeout=30).json()[
        "id"
    ]
    for query in ("include=message.output_text.logprobs", "include[]=reasoning.encrypted_content"):
        r = httpx.get(f"{url}/{rid}?{query}", timeout=30)  # (not ignored: refused, as on POST)
        assert r.status_code == 400 and r.json()["error"]["param"] == "include", query
    for query in (
        "limit=0",
        "limit=101",
        "limit=x",
        "order=up",
        "after=",
        "limit=1&limit=2",
        "order=asc&order=desc",
    ):
        rid = httpx.post(url, json={"model": MODEL, "input": "x", "max_output_tokens": 2}, timeout=30).json()[
            "id"
        ]
        r = httpx.get(f"{url}/{rid}/input_items?{query}", timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] in ("limit", "order", "after"), query


def test_a_p0_response_preempts_a_p3_response_which_resumes_unchanged(tmp_path: Path) -> None:
    cfg = replace(ServerConfig(), workers=(tiny(1),), data_dir=tmp_path)
    with live_server(cfg) as s:
        c = client(s)

        def p3() -> Any:
            return c.responses.create(
                model=MODEL, input="long", max_output_tokens=100, temperature=0, extra_body={"priority": "P3"}
            )

        alone = p3()
        assert alone.usage is not None and alone.usage.output_tokens == 100
        got = overtaken(
            s.runtime,
            p3,
            lambda: c.responses.create(
                model=MODEL, input="urgent", max_output_tokens=5, temperature=0, extra_body={"priority": "P0"}
            ),
            lambda tk: tk.tokens >= 5,
        )
        resumed, p0 = got.low, got.urgent
        assert p0.model_extra["laneway"]["priority"] == "P0"  # type: ignore[index]
        assert got.urgent_first, "the P3 response finished before the P0 was answered"
        assert resumed.model_extra["laneway"]["preemptions"] >= 1
        assert resumed.output_text == alone.output_text


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    cfg = parse_config(
        {
            "server": {"data_dir": str(tmp_path_factory.mktemp("tenants"))},
            "workers": [{"name": "w", "model": MODEL, "slots": 2}],
            "tenants": {
                "alice": {"key_sha256": [hash_key(ALICE)]},
                "bob": {"key_sha256": [hash_key(BOB)]},
            },
        }
    )
    with live_server(cfg) as s:
        yield s


def test_stored_responses_are_private_to_their_tenant(keyed: LiveServer) -> None:
    alice, bob = client(keyed, ALICE), client(keyed, BOB)
    r = alice.responses.create(model=MODEL, input="secret", max_output_tokens=4)
    for call in (
        lambda: bob.responses.retrieve(r.id),
        lambda: bob.responses.input_items.list(r.id),
        lambda: bob.responses.delete(r.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError, match="previous response"):
        bob.responses.create(model=MODEL, input="tell me", previous_response_id=r.id)
    assert alice.responses.retrieve(r.id).output_text == r.output_text  # bob's tries changed nothing
    r = httpx.get(f"{keyed.base_url}/responses/{r.id}", timeout=30)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_stored_responses_survive_a_restart(tmp_path: Path) -> None:
    cfg = replace(ServerConfig(), workers=(tiny(1),), data_dir=tmp_path)
    with live_server(cfg) as s:
        r = client(s).responses.create(model=MODEL, input="remember", max_output_tokens=4, temperature=0)
    with live_server(cfg) as s:
        c = client(s)
        assert c.responses.retrieve(r.id).output_text == r.output_text
        nxt = c.responses.create(
            model=MODEL, input="and?", previous_response_id=r.id, max_output_tokens=4, temperature=0
        )
        history = [
            {"role": "user", "content": "remember"},
            {"role": "assistant", "content": r.output_text},
            {"role": "user", "content": "and?"},
        ]
        assert nxt.output_text == chat_text(c, history, 4)[0]
