"""OpenAI's OpenAPI description as a contract, checked against a live server.

The operations laneway serves are taken from OpenAI's own description
(``tests/openapi_subset.py``). Schemathesis generates requests from it, valid
ones and invalid ones, and sends them to a live server with a simulated
worker; no answer may be a 5xx, every 2xx body must match the spec's response
schema, and the server may log no traceback. Hand-built valid requests make
sure that every operation (but embeddings, which only an upstream answers)
has 2xx answers to check: on the simulated worker, on the built-in engine
(log-probabilities, several choices) and through an upstream worker (the
stand-in engine), streamed chat chunks included. Doctored answers and a
broken worker show that the checks fail when they should.

Where laneway deliberately differs from the spec, :data:`DIFFERENCES` says
so, one line each (README "Differences from OpenAI's spec" too), and exactly
those fields are patched in the spec used here: any other violation fails.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import referencing
import requests
import schemathesis
import uvicorn
from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.errors import UnsupportedSchema
from schemathesis.specs.openapi.checks import response_schema_conformance

import openapi_subset
from laneway.backends.simulated import SimulatedWorker
from laneway.config import ServerConfig, WorkerConfig
from laneway.standin import StandIn
from live_server import LiveServer, live_server, sim_config, tiny

# per operation and generation mode; more for a deeper search: LANEWAY_CONTRACT_EXAMPLES=500
MAX_EXAMPLES = int(os.environ.get("LANEWAY_CONTRACT_EXAMPLES", "25"))
SIM_TOKENS = 6  # the simulated worker's answers are this long, whatever max_tokens asks
LOGGERS = ("laneway", "uvicorn.error", "asyncio")  # where a traceback of the server would go


@dataclass(frozen=True)
class Difference:
    """A field the spec types as non-null where laneway answers ``null`` (and why that is right)."""

    pointer: str  # under #/components/schemas
    reason: str


_EMPTY = "null on an empty page: there is no such id (the key is there, as the spec requires for files)"
_UNTIL = "null until the batch reaches that status (OpenAI's own SDK types it Optional)"
_NO_FILE = "null while the batch has no such file (OpenAI's own SDK types it Optional)"
DIFFERENCES: tuple[Difference, ...] = (
    Difference("ListFilesResponse/properties/first_id", _EMPTY),
    Difference("ListFilesResponse/properties/last_id", _EMPTY),
    Difference("ListBatchesResponse/properties/first_id", _EMPTY),
    Difference("ListBatchesResponse/properties/last_id", _EMPTY),
    Difference("ResponseItemList/properties/first_id", _EMPTY),
    Difference("ResponseItemList/properties/last_id", _EMPTY),
    Difference("OpenAIFile/properties/expires_at", "null: laneway's files do not expire"),
    Difference("OpenAIFile/properties/status_details", "null: deprecated, and there are no details"),
    Difference("Batch/properties/errors", "null while validation found no errors (SDK: Optional)"),
    Difference("Batch/properties/output_file_id", _NO_FILE),
    Difference("Batch/properties/error_file_id", _NO_FILE),
    Difference("Batch/properties/in_progress_at", _UNTIL),
    Difference("Batch/properties/finalizing_at", _UNTIL),
    Difference("Batch/properties/completed_at", _UNTIL),
    Difference("Batch/properties/failed_at", _UNTIL),
    Difference("Batch/properties/expired_at", _UNTIL),
    Difference("Batch/properties/cancelling_at", _UNTIL),
    Difference("Batch/properties/cancelled_at", _UNTIL),
)
# Different too, where the spec has no schema the check reads (so nothing is patched for them):
# - GET /v1/files/{file_id}/content answers the file's bytes as application/octet-stream (the
#   spec: a JSON string);
# - a line of a batch's error file for an input line that is not JSON has "custom_id": null
#   (the spec describes no output or error line);
# - a streamed text completion's chunks have "finish_reason": null until the last (the spec
#   describes only the whole answer);
# - /v1/embeddings answers are the upstream's own (the built-in engines serve none).


# ------------------------------------------------------------------ the spec
def _resolve(spec: dict[str, Any], pointer: str) -> tuple[dict[str, Any], str]:
    """The parent object and key of ``pointer`` (under #/components/schemas)."""
    *parents, last = pointer.split("/")
    node = spec["components"]["schemas"]
    for part in parents:
        node = node[part]
    if last not in node:
        raise KeyError(f"#/components/schemas/{pointer} is not in the spec")
    return node, last


def nullable(node: dict[str, Any]) -> dict[str, Any]:
    """``node``, or ``null``."""
    return {"anyOf": [node, {"type": "null"}]}


def sse_events(chunk: dict[str, Any]) -> dict[str, Any]:
    """The schema of a stream's events whose ``data`` is ``chunk`` (JSON) or ``[DONE]``.

    Not a difference: OpenAI's spec gives a stream's chunk as the schema of
    ``text/event-stream``, where OpenAPI 3.1 (and Schemathesis) read the schema
    of one event (``data``, ``event``, ``id``)."""
    data = {"contentMediaType": "application/json", "contentSchema": chunk}
    return {
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"type": "string"}},
        "if": {"properties": {"data": {"const": "[DONE]"}}},
        "else": {"properties": {"data": data}},
    }


def patched(spec: dict[str, Any]) -> dict[str, Any]:
    for d in DIFFERENCES:
        parent, key = _resolve(spec, d.pointer)
        parent[key] = nullable(parent[key])
    # Not a difference either: a discriminator with no mapping names its schemas' names as the
    # values (OpenAPI), where OpenAI's items say their own type ("message" for InputMessageResource
    # and OutputMessage alike); the oneOf it sits on still checks each item whole.
    for schema in spec["components"]["schemas"].values():
        found = schema.get("discriminator")
        if isinstance(found, dict) and "mapping" not in found:
            del schema["discriminator"]
    for item in spec["paths"].values():
        for op in item.values():
            for answer in op.get("responses", {}).values():
                stream = answer.get("content", {}).get("text/event-stream")
                if stream is not None:
                    stream["schema"] = sse_events(stream["schema"])
    return spec


@pytest.fixture(scope="module")
def raw_spec(request: pytest.FixtureRequest) -> dict[str, Any]:
    cache = getattr(request.config, "cache", None)  # (none with -p no:cacheprovider)
    cache_dir = cache.mkdir("openai-openapi") if cache is not None else None
    return openapi_subset.load_subset(cache_dir=cache_dir)


@pytest.fixture(scope="module")
def spec(raw_spec: dict[str, Any]) -> dict[str, Any]:
    return patched(json.loads(json.dumps(raw_spec)))


def read_nullable(node: Any) -> Any:
    """OpenAPI 3.0's ``nullable: true`` (which OpenAI's 3.1 spec still uses in places, and
    Schemathesis reads) as JSON Schema: the schema or ``null``."""
    if isinstance(node, list):
        return [read_nullable(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: read_nullable(v) for k, v in node.items() if k != "nullable"}
    return nullable(out) if node.get("nullable") is True else out


class Validator:
    """jsonschema validation against a component of the (patched) spec."""

    def __init__(self, spec: dict[str, Any]) -> None:
        resource = referencing.Resource.from_contents(
            read_nullable(spec), default_specification=referencing.jsonschema.DRAFT202012
        )
        self.registry: referencing.Registry[Any] = referencing.Registry().with_resource("urn:spec", resource)

    def errors(self, name: str, instance: object) -> list[str]:
        """``name``: a schema's name, or a pointer under it (``Batch/properties/errors``)."""
        schema = {"$ref": f"urn:spec#/components/schemas/{name}"}
        v = jsonschema.Draft202012Validator(schema, registry=self.registry)
        return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(instance)]

    def check(self, name: str, instance: object) -> None:
        errors = self.errors(name, instance)
        assert not errors, f"{name}: {errors}\n{json.dumps(instance)[:2000]}"


def test_the_subset_holds_the_served_operations_and_all_they_reference(raw_spec: dict[str, Any]) -> None:
    ops = [f"{m.upper()} {path}" for path, item in raw_spec["paths"].items() for m in item]
    assert sorted(ops) == sorted(OPERATIONS)
    for ref in set(openapi_subset.refs(raw_spec)):
        section, name = openapi_subset.component(ref)
        assert name in raw_spec["components"][section], ref
    assert len(raw_spec["components"]["schemas"]) < 450  # of OpenAI's ~1400 (the Responses API brings most)


def test_the_kept_subset_is_what_the_whole_description_gives() -> None:
    """The subset kept in the repository is the extraction of OpenAI's description, where
    that is at hand (CI has it beside the repository); else the kept one is all there is."""
    path = openapi_subset.spec_path()
    if path is None:  # (nothing to compare with here: the kept subset is the contract)
        assert openapi_subset.load_kept()["paths"]
        return
    assert openapi_subset.load_subset(path) == openapi_subset.load_kept()


def test_each_difference_is_real_and_needed(raw_spec: dict[str, Any], spec: dict[str, Any]) -> None:
    """Every listed field exists and rejects null in OpenAI's spec; patched, it takes null and
    still rejects a wrong type (nothing is loosened past null)."""
    original, relaxed = Validator(raw_spec), Validator(spec)
    assert len({d.pointer for d in DIFFERENCES}) == len(DIFFERENCES)
    for d in DIFFERENCES:
        assert d.reason
        _resolve(raw_spec, d.pointer)
        assert original.errors(d.pointer, None), f"{d.pointer} already takes null: drop it"
        assert not relaxed.errors(d.pointer, None)
        assert relaxed.errors(d.pointer, True)  # no field here is a boolean


# ------------------------------------------------------------------ the servers
class ErrorRecords(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def tracebacks(self) -> list[str]:
        return [f"{r.name}: {r.getMessage()}\n{self.format(r)}" for r in self.records if r.exc_info]


@contextlib.contextmanager
def watched(
    config: ServerConfig, workers: dict[str, Any] | None = None
) -> Iterator[tuple[LiveServer, ErrorRecords]]:
    """A live server and the ERROR records of its loggers (attached once uvicorn set its logging up)."""
    with live_server(config, workers) as server:
        handler = ErrorRecords()
        loggers = [logging.getLogger(n) for n in LOGGERS]
        for lg in loggers:
            lg.addHandler(handler)
        try:
            yield server, handler
        finally:
            for lg in loggers:
                lg.removeHandler(handler)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, ErrorRecords]]:
    """The simulated worker, instant and at most SIM_TOKENS long (generated max_tokens can be huge)."""
    config = sim_config(tmp_path_factory.mktemp("contract"), slots=2, tokens_per_s=None)
    worker = SimulatedWorker("sim0", "sim", 2, tokens_per_s=None, output_tokens=SIM_TOKENS)
    with watched(config, {"sim0": worker}) as served:
        yield served


@contextlib.contextmanager
def checked_client(served: tuple[LiveServer, ErrorRecords]) -> Iterator[httpx.Client]:
    """A client of the server (``/v1``); fails if the server logged a traceback meanwhile."""
    server, errors = served
    errors.records.clear()
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client
    assert not errors.tracebacks(), "\n".join(errors.tracebacks())


@pytest.fixture
def http(sim: tuple[LiveServer, ErrorRecords]) -> Iterator[httpx.Client]:
    with checked_client(sim) as client:
        yield client


@pytest.fixture(scope="module")
def restore_hypothesis() -> Iterator[None]:
    """Schemathesis patches Hypothesis globally the first time it makes a strategy (its printer
    prints nothing, a larger buffer): undone after this module, for the rest of the suite."""
    from hypothesis import core as root_core
    from hypothesis.internal import entropy
    from hypothesis.internal.conjecture import engine
    from hypothesis.strategies._internal import collections, core
    from schemathesis.generation.hypothesis import setup

    saved = [
        (root_core, "RepresentationPrinter"),
        (root_core, "BUFFER_SIZE"),
        (engine, "BUFFER_SIZE"),
        (collections, "BUFFER_SIZE"),
        (core, "is_first_param_referenced_in_function"),
        (entropy, "register_random"),
    ]
    values = [(obj, name, getattr(obj, name)) for obj, name in saved if hasattr(obj, name)]
    was_patched = getattr(setup, "_is_patched", False)
    yield
    if not was_patched:
        for obj, name, value in values:
            setattr(obj, name, value)
        setup._is_patched = False  # type: ignore[attr-defined]


# ------------------------------------------------------------------ schemathesis
OPERATIONS = [
    f"{method.upper()} {openapi_subset.PREFIX}{path}"
    for path, methods in openapi_subset.SERVED.items()
    for method in methods
]
# nothing but a string path parameter (any string is one): no invalid request to make
NOTHING_TO_NEGATE = {
    "GET /v1/models",
    "GET /v1/models/{model}",
    "GET /v1/files/{file_id}",
    "DELETE /v1/files/{file_id}",
    "GET /v1/files/{file_id}/content",
    "GET /v1/batches/{batch_id}",
    "POST /v1/batches/{batch_id}/cancel",
    "GET /v1/responses/{response_id}",
    "DELETE /v1/responses/{response_id}",
}
GENERATED = [
    pytest.param(op, mode, id=f"{mode.value}-{op}")
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    for op in OPERATIONS
    if not (mode is GenerationMode.NEGATIVE and op in NOTHING_TO_NEGATE)
]


@dataclass
class Known:
    """Ids that exist on the server, offered to generated requests beside random ones."""

    file_id: str = "file-none"
    batch_id: str = "batch_none"
    response_id: str = "resp_none"


@pytest.fixture(scope="module")
def known() -> Known:
    return Known()


@pytest.fixture(scope="module")
def schema(spec: dict[str, Any], known: Known, restore_hypothesis: None) -> schemathesis.BaseSchema:
    loaded = schemathesis.openapi.from_dict(spec, config=schemathesis.Config())

    @loaded.hook
    def flatmap_body(context: schemathesis.HookContext, body: Any) -> st.SearchStrategy[Any]:
        """As generated, or with names that exist: model "sim", a known input file."""
        if not isinstance(body, dict):
            return st.just(body)
        served = dict(body)
        if "model" in served:
            served["model"] = "sim"
        if "input_file_id" in served:
            served["input_file_id"] = known.file_id
        return st.sampled_from([served, body])

    @loaded.hook
    def flatmap_path_parameters(
        context: schemathesis.HookContext, path_parameters: dict[str, Any] | None
    ) -> st.SearchStrategy[dict[str, Any] | None]:
        if not path_parameters:
            return st.just(path_parameters)
        served = dict(path_parameters)
        for name, value in (
            ("model", "sim"),
            ("file_id", known.file_id),
            ("batch_id", known.batch_id),
            ("response_id", known.response_id),
        ):
            if name in served:
                served[name] = value
        return st.sampled_from([served, path_parameters])

    return loaded


def upload(http: httpx.Client, lines: list[dict[str, Any]] | bytes, name: str = "in.jsonl") -> dict[str, Any]:
    data = lines if isinstance(lines, bytes) else "".join(json.dumps(x) + "\n" for x in lines).encode()
    r = http.post("/files", files={"file": (name, data)}, data={"purpose": "batch"})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def chat_line(i: int, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": f"req-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "sim", "messages": [{"role": "user", "content": f"line {i}"}], **body},
    }


@pytest.mark.parametrize(("operation", "mode"), GENERATED)
def test_generated_requests(
    schema: schemathesis.BaseSchema,
    sim: tuple[LiveServer, ErrorRecords],
    http: httpx.Client,
    known: Known,
    operation: str,
    mode: GenerationMode,
) -> None:
    """No 5xx, and every 2xx conforms to the spec (but the DIFFERENCES)."""
    known.file_id = upload(http, [chat_line(0)])["id"]
    r = create_batch(http, known.file_id)
    assert r.status_code == 200, r.text
    known.batch_id = r.json()["id"]
    r = http.post("/responses", json={"model": "sim", "input": "Hi", "max_output_tokens": 2})
    assert r.status_code == 200, r.text
    known.response_id = r.json()["id"]
    method, path = operation.split(" ")
    op = schema[path][method]
    statuses: list[int] = []

    with requests.Session() as session:

        @settings(
            max_examples=MAX_EXAMPLES,
            derandomize=True,  # the same requests every run
            database=None,
            deadline=None,
            phases=[Phase.generate, Phase.shrink],
            suppress_health_check=list(HealthCheck),
            print_blob=False,
        )
        @given(case=_expressible(op.as_strategy(mode)))
        def run(case: schemathesis.Case) -> None:
            response = case.call(base_url=sim[0].url, session=session, timeout=30)
            statuses.append(response.status_code)
            checks: list[Callable[..., Any]] = [not_a_server_error]
            if 200 <= response.status_code < 300:
                checks.append(response_schema_conformance)
            case.validate_response(response, checks=checks)

        run()
    assert statuses, "no request was sent"


@st.composite
def _expressible(draw: st.DrawFn, cases: st.SearchStrategy[schemathesis.Case]) -> schemathesis.Case:
    """A case of ``cases``; one Schemathesis cannot make is not a request (its negative mode
    may build a mutation it then cannot draw from: "a `not` whose complement is not spelled
    out", seen once for POST /v1/responses in a full run) and is drawn again. The test still
    asks that requests were sent."""
    try:
        return draw(cases)
    except UnsupportedSchema:
        reject()


# ------------------------------------------------------------------ hand-built valid requests
def conforms(
    schema: schemathesis.BaseSchema, response: httpx.Response, **path_parameters: str
) -> dict[str, Any]:
    """``response`` is a 200 whose body matches its operation's response schema; the body."""
    request = response.request
    request.read()  # a multipart upload's body, for the report of a failure
    assert response.status_code == 200, f"{request.method} {request.url}: {response.text}"
    names = {value: "{" + name + "}" for name, value in path_parameters.items()}
    path = "/".join(names.get(part, part) for part in request.url.path.split("/"))
    case = schema[path][request.method].Case(path_parameters=path_parameters or None)
    case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])
    if response.headers["content-type"].startswith("application/json"):
        body: dict[str, Any] = response.json()
        return body
    return {}


def sse_chunks(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    lines = [line for line in response.text.splitlines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


@pytest.fixture(scope="module")
def validator(spec: dict[str, Any]) -> Validator:
    return Validator(spec)


HI = [{"role": "user", "content": "Hi"}]


def test_chat_completion_answers(schema: schemathesis.BaseSchema, http: httpx.Client) -> None:
    bodies = [
        {"model": "sim", "messages": HI},
        {
            "model": "sim",
            "messages": [{"role": "system", "content": "be brief"}, *HI],
            "max_completion_tokens": 3,
            "temperature": 0.5,
            "top_p": 0.9,
            "seed": 7,
            "stop": ["\n"],
            "user": "u",
            "metadata": {"k": "v"},
            "n": 1,
            "logprobs": False,
            "service_tier": "flex",
            "priority": "P0",
        },
    ]
    for body in bodies:
        r = conforms(schema, http.post("/chat/completions", json=body))
        assert r["object"] == "chat.completion" and r["choices"][0]["message"]["refusal"] is None
        assert r["usage"]["completion_tokens"] == min(
            body.get("max_completion_tokens", SIM_TOKENS), SIM_TOKENS
        )


def test_streamed_chat_chunks(
    schema: schemathesis.BaseSchema, http: httpx.Client, validator: Validator
) -> None:
    for options in ({}, {"stream_options": {"include_usage": True}}):
        r = http.post("/chat/completions", json={"model": "sim", "messages": HI, "stream": True, **options})
        conforms(schema, r)
        chunks = sse_chunks(r)
        for chunk in chunks:
            validator.check("CreateChatCompletionStreamResponse", chunk)
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
        if options:
            assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == SIM_TOKENS


def response_events(response: httpx.Response) -> list[dict[str, Any]]:
    """A Responses stream's events (``event:`` and ``data:`` lines; no ``[DONE]``), each
    named as its data's ``type``."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in response.text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        data = json.loads(fields["data"])
        assert fields["event"] == data["type"]
        events.append(data)
    return events


def check_responses(
    schema: schemathesis.BaseSchema, client: httpx.Client, validator: Validator, model: str
) -> None:
    """Whole and streamed responses, and what reads them back, match the spec."""
    bodies: list[dict[str, Any]] = [
        {"model": model, "input": "Hi"},
        {
            "model": model,
            "input": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Hello"}],
                },
                {"role": "user", "content": "more"},
            ],
            "instructions": "answer",
            "max_output_tokens": 3,
            "temperature": 0,
            "top_p": 0.5,
            "metadata": {"k": "v"},
            "user": "u",
            "store": True,
            "service_tier": "flex",
            "text": {"format": {"type": "text"}, "verbosity": "low"},
            "tools": [],
            "priority": "P0",
            **openapi_subset.SAID_BACK,  # (said back as given)
        },
    ]
    for body in bodies:
        whole = conforms(schema, client.post("/responses", json=body))
        assert whole["object"] == "response" and whole["output"][0]["type"] == "message"
        again = conforms(
            schema, client.post("/responses", json={**body, "previous_response_id": whole["id"]})
        )
        assert again["previous_response_id"] == whole["id"]
        r = client.post("/responses", json={**body, "stream": True})
        conforms(schema, r)
        events = response_events(r)
        for event in events:
            validator.check("ResponseStreamEvent", event)
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[-1]["type"] in ("response.completed", "response.incomplete")
        rid = events[-1]["response"]["id"]
        assert conforms(schema, client.get(f"/responses/{rid}"), response_id=rid)["id"] == rid
        items = conforms(schema, client.get(f"/responses/{rid}/input_items"), response_id=rid)
        assert len(items["data"]) == (1 if isinstance(body["input"], str) else 4)
        assert client.delete(f"/responses/{rid}").json() == {"id": rid, "object": "response", "deleted": True}


def test_input_items_of_a_response_an_upstream_answers(validator: Validator) -> None:
    """Before an upstream's Responses API, the input is forwarded as given, and listed (``GET
    /v1/responses/{id}/input_items``) in OpenAI's shape: a message's string content as a text
    part, with a status; an item of another type as it came."""
    from laneway.protocol.responses_api import read_responses

    given = [
        {"role": "user", "content": "Hi"},
        {"type": "message", "role": "assistant", "content": "Hello"},
        {"role": "developer", "content": [{"type": "input_text", "text": "Be brief"}]},
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": "42",
            "id": "fc_1",
            "status": "completed",
        },
    ]
    for body in ({"model": "m", "input": "Hi"}, {"model": "m", "input": given}):
        items = list(read_responses(body, engine=False).input_items)
        listed = {"object": "list", "data": items, "first_id": items[0]["id"], "last_id": items[-1]["id"]}
        validator.check("ResponseItemList", {**listed, "has_more": False})
    assert items[0]["content"] == [{"type": "input_text", "text": "Hi"}] and items[0]["status"] == "completed"
    assert items[1]["content"][0]["type"] == "output_text"
    assert items[3] == given[3]


def test_response_failure_events(validator: Validator) -> None:
    """An error after a stream began: the ``error`` event, then ``response.failed``, as the spec has them."""
    from laneway.protocol.responses_answer import Answer
    from laneway.protocol.responses_api import read_responses

    answer = Answer(read_responses({"model": "sim", "input": "Hi"}), "sim", 1)
    events = [*answer.opening(), answer.delta("Hel")]
    ext = {"priority": "P2", "queue_ms": 1.0, "preemptions": 0, "worker": "sim0"}
    events += answer.failure("rate_limit_exceeded", "over quota", None, "Hel", ext)
    events += answer.failure("generation_failed", "the engine failed", "model", "Hel", ext)
    events.append(answer.event("error", code="store_unavailable", message="not stored", param="store"))
    for raw in events:
        data = json.loads(raw.split(b"data: ", 1)[1])
        validator.check("ResponseStreamEvent", data)
    failed = [json.loads(raw.split(b"data: ", 1)[1]) for raw in events if b"response.failed" in raw]
    assert [f["response"]["error"]["code"] for f in failed] == ["rate_limit_exceeded", "server_error"]
    assert failed[0]["response"]["output"][0]["content"][0]["text"] == "Hel"


def test_responses(schema: schemathesis.BaseSchema, http: httpx.Client, validator: Validator) -> None:
    check_responses(schema, http, validator, "sim")


def test_completion_answers(schema: schemathesis.BaseSchema, http: httpx.Client) -> None:
    for body in (
        {"model": "sim", "prompt": "Hello"},
        {"model": "sim", "prompt": "Hello", "max_tokens": 2, "temperature": 0, "stop": "x", "echo": False},
    ):
        r = conforms(schema, http.post("/completions", json=body))
        assert r["object"] == "text_completion" and r["choices"][0]["finish_reason"] == "length"


def test_models(schema: schemathesis.BaseSchema, http: httpx.Client) -> None:
    assert [m["id"] for m in conforms(schema, http.get("/models"))["data"]] == ["sim"]
    assert conforms(schema, http.get("/models/sim"), model="sim")["id"] == "sim"


def test_files(schema: schemathesis.BaseSchema, http: httpx.Client) -> None:
    lines = [chat_line(0)]
    r = http.post(
        "/files", files={"file": ("in.jsonl", json.dumps(lines[0]).encode())}, data={"purpose": "batch"}
    )
    made = conforms(schema, r)
    fid = made["id"]
    assert made["purpose"] == "batch" and made["filename"] == "in.jsonl"
    assert conforms(schema, http.get(f"/files/{fid}"), file_id=fid) == made
    page = conforms(schema, http.get("/files", params={"limit": 1}))
    assert page["data"] == [made] and page["first_id"] == page["last_id"] == fid
    empty = conforms(schema, http.get("/files", params={"purpose": "vision"}))
    assert empty["data"] == [] and empty["first_id"] is None and empty["last_id"] is None
    upload = http.post("/files", files={"file": ("b.jsonl", b"{}")}, data={"purpose": "batch"})
    second = conforms(schema, upload)
    for order, first in (("desc", second["id"]), ("asc", fid), (None, second["id"])):
        query = {"limit": 10_000, **({"order": order} if order else {})}  # (other tests' files too)
        listed = http.get("/files", params=query).json()["data"]
        mine = [f["id"] for f in listed if f["id"] in (fid, second["id"])]
        assert mine[0] == first and len(mine) == 2, (order, mine)
    for path, query in (
        ("/files", {"order": "sideways"}),
        ("/files", {"after": ""}),
        ("/batches", {"after": ""}),
    ):
        bad = http.get(path, params=query)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == next(iter(query)), bad.text
    http.delete(f"/files/{second['id']}")
    content = http.get(f"/files/{fid}/content")
    conforms(schema, content, file_id=fid)
    assert json.loads(content.content) == lines[0]
    gone = conforms(schema, http.delete(f"/files/{fid}"), file_id=fid)
    assert gone == {"id": fid, "object": "file", "deleted": True}


def wait_batch(http: httpx.Client, batch_id: str, statuses: set[str], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        status = http.get(f"/batches/{batch_id}").json()["status"]
        if status in statuses:
            return
        assert time.monotonic() < deadline, f"batch {batch_id} is still {status}"
        time.sleep(0.05)


def create_batch(http: httpx.Client, file_id: str, **extra: Any) -> httpx.Response:
    body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **extra}
    return http.post("/batches", json=body)


def test_batches(schema: schemathesis.BaseSchema, http: httpx.Client, validator: Validator) -> None:
    """A batch made, listed, completed (its output lines hold chat completions in the spec's shape),
    one cancelled, one failed in validation (its errors in the spec's shape)."""
    fid = upload(http, [chat_line(i, max_tokens=2) for i in range(3)])["id"]
    made = conforms(schema, create_batch(http, fid, metadata={"priority": "P3", "team": "a"}))
    bid = made["id"]
    assert made["status"] == "validating" and made["metadata"] == {"priority": "P3", "team": "a"}
    wait_batch(http, bid, {"completed"})
    done = conforms(schema, http.get(f"/batches/{bid}"), batch_id=bid)
    assert done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    out = http.get(f"/files/{done['output_file_id']}/content")
    for line in out.text.splitlines():
        result = json.loads(line)
        assert result["response"]["status_code"] == 200 and result["error"] is None
        validator.check("CreateChatCompletionResponse", result["response"]["body"])
    page = conforms(schema, http.get("/batches", params={"limit": 2}))
    assert page["data"][0]["id"] == bid and page["first_id"] == bid

    many = upload(http, [chat_line(i) for i in range(500)])["id"]  # ~0.3 s of work: time to cancel it
    to_cancel = conforms(schema, create_batch(http, many))["id"]
    cancelling = conforms(schema, http.post(f"/batches/{to_cancel}/cancel"), batch_id=to_cancel)
    assert cancelling["status"] in ("cancelling", "cancelled")
    wait_batch(http, to_cancel, {"cancelled"})
    assert conforms(schema, http.get(f"/batches/{to_cancel}"), batch_id=to_cancel)["cancelled_at"] is not None

    bad = upload(
        http, b'{"custom_id": "ok", "method": "POST", "url": "/v1/chat/completions", "body": {}}\nnot json\n'
    )
    failing = conforms(schema, create_batch(http, bad["id"]))["id"]
    wait_batch(http, failing, {"failed"})
    failed = conforms(schema, http.get(f"/batches/{failing}"), batch_id=failing)
    assert failed["errors"]["data"] and failed["error_file_id"] is not None
    errors = [json.loads(x) for x in http.get(f"/files/{failed['error_file_id']}/content").text.splitlines()]
    assert {e["custom_id"] for e in errors} == {"ok", None}  # no custom_id on a line that is not JSON


def test_the_check_catches_violations(schema: schemathesis.BaseSchema) -> None:
    """Doctored answers fail the same check: a chat completion without ``message.refusal``, a
    stream chunk without ``choices``, a batch whose ``output_file_id`` is a number (the
    difference lets only null through)."""

    def fails(operation: str, body: bytes, content_type: str = "application/json") -> None:
        method, path = operation.split(" ")
        request = httpx.Request(method, "http://127.0.0.1:1" + path)
        response = httpx.Response(200, headers={"content-type": content_type}, content=body, request=request)
        response.elapsed = datetime.timedelta(0)
        with pytest.raises(schemathesis.errors.FailureGroup):
            schema[path][method].Case().validate_response(response, checks=[response_schema_conformance])

    head = {"id": "chatcmpl-1", "created": 1, "model": "sim"}
    message = {"role": "assistant", "content": "hi"}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
    fails(
        "POST /v1/chat/completions",
        json.dumps({**head, "object": "chat.completion", "choices": [choice]}).encode(),
    )
    chunk = {**head, "object": "chat.completion.chunk"}
    fails(
        "POST /v1/chat/completions",
        f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode(),
        "text/event-stream",
    )
    batch = {
        "id": "batch_1",
        "object": "batch",
        "endpoint": "/v1/chat/completions",
        "input_file_id": "file-1",
        "completion_window": "24h",
        "status": "completed",
        "created_at": 1,
        "output_file_id": 5,
    }
    fails("GET /v1/batches", json.dumps({"object": "list", "data": [batch], "has_more": False}).encode())
    batch["output_file_id"] = None
    listed = {"object": "list", "data": [batch], "has_more": False}  # and the same with null passes
    request = httpx.Request("GET", "http://127.0.0.1:1/v1/batches")
    ok = httpx.Response(200, json=listed, request=request)
    ok.elapsed = datetime.timedelta(0)
    schema["/v1/batches"]["GET"].Case().validate_response(ok, checks=[response_schema_conformance])


class Broken(SimulatedWorker):
    async def run(self, job: Any, sink: Any) -> None:
        raise RuntimeError("a worker that breaks")


def test_the_check_catches_a_failing_server(schema: schemathesis.BaseSchema, tmp_path: Path) -> None:
    """A 5xx fails ``not_a_server_error``, and the server's traceback is seen in its log."""
    with watched(sim_config(tmp_path), {"sim0": Broken("sim0", "sim", 1)}) as (server, errors):
        case = schema["/v1/chat/completions"]["POST"].Case(body={"model": "sim", "messages": HI})
        with requests.Session() as session:
            response = case.call(base_url=server.url, session=session, timeout=30)
        assert response.status_code == 502
        with pytest.raises(schemathesis.errors.FailureGroup):
            case.validate_response(response, checks=[not_a_server_error])
        assert any("a worker that breaks" in t for t in errors.tracebacks())


# ------------------------------------------------------------------ the built-in engine
@pytest.fixture(scope="module")
def builtin_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, ErrorRecords]]:
    """The in-process engine (builtin:tiny): log-probabilities, several choices, token ids."""
    config = replace(ServerConfig(), workers=(tiny(2),), data_dir=tmp_path_factory.mktemp("b"))
    with watched(config) as served:
        yield served


@pytest.fixture
def engine(builtin_served: tuple[LiveServer, ErrorRecords]) -> Iterator[httpx.Client]:
    with checked_client(builtin_served) as client:
        yield client


TINY = "builtin:tiny"


def test_engine_responses(
    schema: schemathesis.BaseSchema, engine: httpx.Client, validator: Validator
) -> None:
    check_responses(schema, engine, validator, TINY)
    body = {"model": TINY, "input": "Hi", "instructions": "answer"}
    counted = conforms(schema, engine.post("/responses/input_tokens", json=body))
    made = engine.post("/responses", json={**body, "max_output_tokens": 1}).json()
    assert counted["input_tokens"] == made["usage"]["input_tokens"]


def test_engine_chat_with_logprobs_and_choices(
    schema: schemathesis.BaseSchema, engine: httpx.Client, validator: Validator
) -> None:
    body = {
        "model": TINY,
        "messages": HI,
        "max_tokens": 4,
        "logprobs": True,
        "top_logprobs": 2,
        "n": 2,
        "seed": 1,
    }
    r = conforms(schema, engine.post("/chat/completions", json={**body, "return_token_ids": True}))
    assert [c["index"] for c in r["choices"]] == [0, 1]
    assert all(len(c["logprobs"]["content"]) == 4 for c in r["choices"])
    stream = engine.post(
        "/chat/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    conforms(schema, stream)
    chunks = sse_chunks(stream)
    for chunk in chunks:
        validator.check("CreateChatCompletionStreamResponse", chunk)
    assert any(c["choices"] and c["choices"][0]["logprobs"] for c in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == 8


def test_engine_completion_with_logprobs_and_choices(
    schema: schemathesis.BaseSchema, engine: httpx.Client
) -> None:
    body = {"model": TINY, "prompt": "Hello", "max_tokens": 4, "logprobs": 2, "n": 2, "seed": 1}
    r = conforms(schema, engine.post("/completions", json=body))
    assert [len(c["logprobs"]["tokens"]) for c in r["choices"]] == [4, 4]
    r = conforms(
        schema, engine.post("/completions", json={"model": TINY, "prompt": [1, 2, 3], "max_tokens": 2})
    )
    assert r["usage"]["prompt_tokens"] == 3


# ------------------------------------------------------------------ in front of an upstream
@contextlib.contextmanager
def standin_url() -> Iterator[str]:
    """The stand-in engine (vLLM's HTTP behaviour) on a thread: its ``/v1`` URL."""
    server = uvicorn.Server(
        uvicorn.Config(
            StandIn("standin", slots=2, ms_per_token=0), host="127.0.0.1", port=0, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, name="standin", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the stand-in did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/v1"
    finally:
        server.should_exit = True
        thread.join(15)
        assert not thread.is_alive(), "the stand-in did not stop"


@pytest.fixture(scope="module")
def upstream_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, ErrorRecords]]:
    with standin_url() as url:
        worker = WorkerConfig("up", type="upstream", url=url, model="standin", served_name="up", slots=2)
        config = replace(ServerConfig(), workers=(worker,), data_dir=tmp_path_factory.mktemp("up"))
        with watched(config) as served:
            yield served


@pytest.fixture
def upstream(upstream_served: tuple[LiveServer, ErrorRecords]) -> Iterator[httpx.Client]:
    with checked_client(upstream_served) as client:
        yield client


def test_upstream_answers(
    schema: schemathesis.BaseSchema, upstream: httpx.Client, validator: Validator
) -> None:
    """Through an upstream worker: a whole answer assembled from its stream, its own chunks."""
    chat = {"model": "up", "messages": HI, "max_tokens": 3}
    r = conforms(schema, upstream.post("/chat/completions", json=chat))
    assert r["choices"][0]["message"]["refusal"] is None and r["usage"]["completion_tokens"] == 3
    stream = upstream.post(
        "/chat/completions", json={**chat, "stream": True, "stream_options": {"include_usage": True}}
    )
    conforms(schema, stream)
    chunks = sse_chunks(stream)
    for chunk in chunks:
        validator.check("CreateChatCompletionStreamResponse", chunk)
    assert chunks[-1]["usage"]["completion_tokens"] == 3
    r = conforms(schema, upstream.post("/completions", json={"model": "up", "prompt": "Hi", "max_tokens": 3}))
    assert r["choices"][0]["finish_reason"] == "length"
