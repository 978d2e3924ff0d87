"""Well over a thousand hostile inputs against a live server: never a 5xx, a hang or
a traceback, every refusal in OpenAI's error shape, and the server still serves.

A catalogue of the classes of bad input found by hand (deep nesting, numbers out
of range, lone surrogates, wrong types, odd query strings, paths and headers,
bad uploads and batch files), then Hypothesis: JSON values of every kind merged
into otherwise valid requests of each endpoint, and batch files of such lines.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laneway.backends.simulated import SimulatedWorker
from live_server import LiveServer, live_server, sim_config

REQUEST_TIMEOUT_S = 30.0  # a hang is a failure
ENDED = {"completed", "failed", "cancelled", "expired"}


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Hostile:
    server: LiveServer
    http: httpx.Client
    errors: Records
    sent: int = 0

    def send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        kw.setdefault("timeout", REQUEST_TIMEOUT_S)
        r = self.http.request(method, path, **kw)
        self.sent += 1
        assert r.status_code < 500, (method, path, kw.get("content", kw.get("json")), r.status_code, r.text)
        if r.status_code >= 400 and r.headers.get("content-type", "").startswith("application/json"):
            err = r.json()["error"]
            assert isinstance(err["message"], str) and err["message"], r.text
            assert set(err) >= {"message", "type", "code", "param"}, r.text
        return r

    def post_raw(self, path: str, content: bytes | str) -> httpx.Response:
        return self.send("POST", path, content=content, headers={"content-type": "application/json"})


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    tmp: Path = tmp_path_factory.mktemp("hostile")
    # every job ends after 3 tokens whatever its max_tokens: a hang is the server's
    worker = SimulatedWorker("sim0", "sim", 4, tokens_per_s=None, output_tokens=3)
    config = replace(sim_config(tmp), max_body_bytes=64 * 1024)
    errors = Records()
    loggers = [logging.getLogger(n) for n in ("laneway", "uvicorn", "uvicorn.error", "uvicorn.asgi")]
    with live_server(config, {"sim0": worker}) as server:
        for lg in loggers:
            lg.addHandler(errors)
        try:
            with httpx.Client(base_url=server.url) as http:
                h = Hostile(server, http, errors)
                yield h
                assert h.http.get("/readyz").status_code == 200  # still serving
        finally:
            for lg in loggers:
                lg.removeHandler(errors)
    tracebacks = [r for r in errors.records if r.exc_info]
    assert not tracebacks, [r.getMessage() for r in tracebacks]


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}


def completion(**extra: Any) -> dict[str, Any]:
    return {"model": "sim", "prompt": "hi", "max_tokens": 2, **extra}


def nest(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


BIG = "1" + "0" * 400
ODD_VALUES: list[str] = [
    BIG,
    "-" + BIG,
    "1e400",
    "-1e400",
    "NaN",
    "Infinity",
    "1e-400",
    "5e-324",
    "18446744073709551616",
    "9223372036854775808",
    "-9223372036854775809",
    '"\\ud800"',
    '"\\udfff\\ud800"',
    '"x\\u0000y"',
    "[]",
    "{}",
    "null",
    "true",
    '"1"',
    nest(100),
    '{"a": ' * 70 + "1" + "}" * 70,
]
FIELDS = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "n",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "priority",
    "service_tier",
    "user",
    "metadata",
    "logprobs",
    "top_logprobs",
    "tools",
    "response_format",
    "laneway",
    "input",
    "logit_bias",
    "presence_penalty",
]
RESPONSES_FIELDS = [
    "input",
    "instructions",
    "previous_response_id",
    "store",
    "max_output_tokens",
    "text",
    "reasoning",
    "include",
    "tool_choice",
    "truncation",
    "background",
]


def test_the_catalogue_of_bad_input(hostile: Hostile) -> None:
    h = hostile
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/batches", "/v1/responses"):
        for depth in (1_000, 100_000, 500_000):
            h.post_raw(path, nest(depth))
            h.post_raw(path, '{"model": "sim", "x": ' + nest(depth) + "}")
        for raw in ("", " ", "{", "[1]", "1", '"x"', "null", b"\xff\xfe", b'{"a": "\xc3"}', "{}" * 3):
            assert h.post_raw(path, raw).status_code == 400
    base = json.dumps(chat())[:-1]
    cbase = json.dumps(completion())[:-1]
    for field in FIELDS:
        for value in ODD_VALUES:
            for head in (base, cbase):
                path = "/v1/chat/completions" if head is base else "/v1/completions"
                h.post_raw(path, f'{head}, "{field}": {value}}}')
    rbase = '{"model": "sim", "input": "x"'
    for field in (*FIELDS, *RESPONSES_FIELDS):
        for value in ODD_VALUES:
            h.post_raw("/v1/responses", f'{rbase}, "{field}": {value}}}')
    rid = h.send("POST", "/v1/responses", json={"model": "sim", "input": "x"}).json()["id"]
    for query in (
        "limit=²",
        "limit=0",
        "limit=" + "9" * 50,
        "order=%00",
        "after=%ED%A0%80",
        "after=" + "x" * 5000,
    ):
        h.send("GET", f"/v1/responses/{rid}/input_items?{query}")
    for value in ("\\ud800", "\\udbff\\udfff\\ud800", "ok\\udc00"):
        h.post_raw(
            "/v1/chat/completions",
            '{"model": "sim", "messages": [{"role": "user", "content": "V"}]}'.replace("V", value),
        )
        h.post_raw("/v1/completions", '{"model": "sim\\ud800", "prompt": "x"}')
    for query in (
        "limit=²",
        "limit=-1",
        "limit=0",
        "limit=" + "9" * 50,
        "limit=1e3",
        "after=%ED%A0%80",
        "limit=%00",
        "after=" + "x" * 5000,
        "limit=١٢",
    ):
        for path in ("/v1/files", "/v1/batches"):
            h.send("GET", f"{path}?{query}")
    for query in ("priority=P9", "priority=²", "priority=%ED%A0%80", "model=" + "m" * 3000, "priority=1e400"):
        h.send("GET", f"/v1/queue/estimate?{query}")
    for path in (
        "/v1/files/%00",
        "/v1/files/..%2F..%2Fetc%2Fpasswd",
        "/v1/batches/%ED%A0%80",
        "/v1/models/%FF",
        "/v1/files/" + "x" * 10_000,
        "/v1/batches/x/cancel/",
        "/v1/responses/%ED%A0%80",
        "/v1/responses/" + "x" * 10_000 + "/input_items",
        "/v1//files",
        "/%2e%2e/v1/models",
    ):
        h.send("GET", path)
        h.send("DELETE", path)
        h.send("POST", path, content=b"{}")
    for priority in ("P9", "²", "-1", "1" * 500, "p0 p1", "P0\x7f"):
        h.send("POST", "/v1/chat/completions", json=chat(), headers={"x-laneway-priority": priority.encode()})
    for auth in ("Bearer", "Bearer " + "k" * 10_000, "Basic x", "bearer  x"):
        h.send("POST", "/v1/chat/completions", json=chat(), headers={"authorization": auth})
    for ctype in ("text/plain", "application/json; charset=latin-1", "multipart/form-data", ""):
        h.send("POST", "/v1/chat/completions", content=json.dumps(chat()), headers={"content-type": ctype})
    for endpoint in (["a"], {"x": 1}, 1, None, "/v1/chat/completions\u0000", "\ud800"):
        body = {"input_file_id": "file-x", "endpoint": endpoint, "completion_window": "24h"}
        h.post_raw("/v1/batches", json.dumps(body))
    for window in (["24h"], 1e400, "1e400h", "-1h", "99999999999999999999d", "\ud800", "24 h", "²h"):
        h.post_raw(
            "/v1/batches",
            json.dumps({"input_file_id": "f", "endpoint": "/v1/completions"})[:-1]
            + ', "completion_window": '
            + (json.dumps(window) if window != 1e400 else "1e400")
            + "}",
        )
    for metadata in ([], {"k": BIG}, {"k" * 100: "v"}, {str(i): "v" for i in range(50)}, {"k": "\ud800"}):
        h.post_raw(
            "/v1/batches",
            json.dumps(
                {
                    "input_file_id": "f",
                    "endpoint": "/v1/completions",
                    "completion_window": "24h",
                    "metadata": metadata,
                }
            ),
        )
    uploads: list[dict[str, Any]] = [
        {"files": {"file": ("a.jsonl", b"\xff\xfe\x00")}, "data": {"purpose": "batch"}},
        {"files": {"file": ("a.jsonl", b"")}, "data": {"purpose": "batch"}},
        {
            "files": {"file": ("\ud800.jsonl".encode("utf-8", "surrogatepass").decode("latin-1"), b"x")},
            "data": {"purpose": "batch"},
        },
        {"files": {"file": ("a.jsonl", b"x")}, "data": {"purpose": ["batch"]}},
        {"files": {"file": ("a.jsonl", b"x")}, "data": {"purpose": "b" * 5000}},
        {"files": {"other": ("a.jsonl", b"x")}, "data": {"purpose": "batch"}},
        {"data": {"purpose": "batch", "file": "x"}},
        {
            "content": b"--x\r\nContent-Disposition: form-data; name=file\r\n\r\nabc",
            "headers": {"content-type": "multipart/form-data; boundary=x"},
        },
        {"content": b"garbage", "headers": {"content-type": "multipart/form-data; boundary="}},
    ]
    for up in uploads:
        h.send("POST", "/v1/files", **up)
    assert h.sent > 700


json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(["sim", "P0", "P3", "auto", "flex", "/v1/completions", "user", "text", "24h"])
)
json_values = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
field_names = st.sampled_from(FIELDS) | st.text(max_size=12)
overrides = st.dictionaries(field_names, json_values, max_size=5)
FUZZ = settings(
    max_examples=250,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def _dumps(value: Any) -> str:
    return json.dumps(value)  # (NaN and inf as NaN / Infinity; lone surrogates as \\ud800)


@FUZZ
@given(overrides)
def test_fuzzed_chat_requests(hostile: Hostile, extra: dict[str, Any]) -> None:
    r = hostile.post_raw("/v1/chat/completions", _dumps({**chat(), **extra}))
    if r.status_code == 200 and "text/event-stream" not in r.headers.get("content-type", ""):
        assert r.json()["object"] == "chat.completion"


@FUZZ
@given(overrides)
def test_fuzzed_completion_requests(hostile: Hostile, extra: dict[str, Any]) -> None:
    hostile.post_raw("/v1/completions", _dumps({**completion(), **extra}))


@settings(FUZZ, max_examples=150)
@given(overrides)
def test_fuzzed_embedding_and_batch_requests(hostile: Hostile, extra: dict[str, Any]) -> None:
    hostile.post_raw("/v1/embeddings", _dumps({"model": "sim", "input": "x", **extra}))
    hostile.post_raw(
        "/v1/batches",
        _dumps(
            {"input_file_id": "file-x", "endpoint": "/v1/completions", "completion_window": "24h", **extra}
        ),
    )


lines = st.lists(
    st.one_of(
        overrides.map(
            lambda o: _dumps(
                {"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": {**completion(), **o}}
            )
        ),
        overrides.map(
            lambda o: _dumps({"custom_id": "c", "url": "/v1/completions", "body": completion(), **o})
        ),
        json_values.map(_dumps),
        st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
    ),
    min_size=1,
    max_size=6,
)


@settings(FUZZ, max_examples=40)
@given(lines)
def test_fuzzed_batch_files_never_wedge(hostile: Hostile, content: list[str]) -> None:
    h = hostile
    data = "\n".join(f"{line.replace(chr(10), ' ')}" for line in content).encode("utf-8", "surrogatepass")
    up = h.send("POST", "/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"})
    if up.status_code != 200:
        return
    made = h.post_raw(
        "/v1/batches",
        _dumps({"input_file_id": up.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"}),
    )
    assert made.status_code == 200, made.text
    deadline = time.monotonic() + 20
    status = made.json()["status"]
    while status not in ENDED:
        assert time.monotonic() < deadline, f"batch stuck in {status}"
        time.sleep(0.05)
        status = h.send("GET", f"/v1/batches/{made.json()['id']}").json()["status"]


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ('{"model": "sim", "prompt": [1, 2, 3]}', "prompt", "token ids is not supported by the simulated"),
        ('{"model": "sim", "prompt": []}', "prompt", "must not be an empty list"),
        ('{"model": "sim", "prompt": "x", "seed": ' + "9" * 5001 + "}", None, "thousands of digits"),
        ('{"model": "sim", "prompt": "x", "max_tokens": 99999999999}', "max_tokens", "from 1 to 2147483647"),
        ('{"model": "sim", "prompt": "x", "user": 5}', "user", "must be a string"),
        ('{"model": "sim", "prompt": "x", "logit_bias": {"' + "9" * 5000 + '": 1}}', "logit_bias", "ids"),
    ],
)
def test_what_cannot_be_taken_is_named_plainly(
    hostile: Hostile, body: str, param: str | None, says: str
) -> None:
    r = hostile.post_raw("/v1/completions", body)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == param and says in err["message"], err


def test_the_priority_header_is_one_value_read_as_its_client_wrote_it(hostile: Hostile) -> None:
    def send(*values: bytes) -> httpx.Response:
        return hostile.send(
            "POST", "/v1/chat/completions", json=chat(), headers=[(b"x-laneway-priority", v) for v in values]
        )

    r = send(b"P3", b"P0")  # which one was meant is not for the server to guess
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "X-Laneway-Priority", err
    assert "'P3', 'P0'" in err["message"], err
    assert send(b"P2", b"P2").status_code == 200  # (the same value twice says one thing)
    r = send("P1é".encode())  # the error shows what was written, not its bytes read as latin-1
    err = r.json()["error"]
    assert r.status_code == 400 and "P1é" in err["message"] and "Ã" not in err["message"], err
    r = hostile.send(
        "GET", "/v1/queue/estimate", headers=[(b"x-laneway-priority", b"P3"), (b"x-laneway-priority", b"P0")]
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Laneway-Priority", r.text
    for query, param in (("priority=P0&priority=P3", "priority"), ("model=a&model=b", "model")):
        r = hostile.send("GET", f"/v1/queue/estimate?{query}")  # (so in the query string too)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == param and "2 different values" in err["message"], err
    assert hostile.send("GET", "/v1/queue/estimate?priority=P1&priority=P1").status_code == 200


def test_a_body_that_gives_its_class_twice_gives_it_once(hostile: Hostile) -> None:
    """``priority`` beside ``laneway.priority`` (or ``preemptible`` beside
    ``laneway.preemptible``) saying another thing is refused, not one taken at a guess."""
    for extra, param in (
        ({"priority": "P0", "laneway": {"priority": "P3"}}, "laneway.priority"),
        ({"preemptible": True, "laneway": {"preemptible": False}}, "laneway.preemptible"),
    ):
        r = hostile.send("POST", "/v1/chat/completions", json={**chat(), **extra})
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == param and "differ" in err["message"], err
    r = hostile.send("POST", "/v1/chat/completions", json={**chat(), "laneway": {"preemptible": "no"}})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "laneway.preemptible", err
    assert err["message"].startswith("laneway.preemptible must be true or false"), err
    # each way of giving a class is checked, whichever wins (a bad tier beside a priority was taken)
    for extra, param in (
        ({"priority": "P0", "service_tier": "bogus"}, "service_tier"),
        ({"priority": "P0"}, "X-Laneway-Priority"),
    ):
        header = {"X-Laneway-Priority": "urgent"} if param == "X-Laneway-Priority" else {}
        r = hostile.send("POST", "/v1/chat/completions", json={**chat(), **extra}, headers=header)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    counted = {"model": "sim", "input": "hi", "priority": "P9"}  # (counting queues nothing, checks all)
    r = hostile.send("POST", "/v1/responses/input_tokens", json=counted)
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text
    same = {"priority": "P2", "laneway": {"priority": 2, "preemptible": True}, "preemptible": True}
    r = hostile.send("POST", "/v1/chat/completions", json={**chat(), **same})
    assert r.status_code == 200 and r.json()["laneway"]["priority"] == "P2", r.text


def test_a_compressed_body_is_refused_naming_its_encoding(hostile: Hostile) -> None:
    import gzip
    import json as jsonlib

    packed = gzip.compress(jsonlib.dumps(chat()).encode())
    for encoding, content in (("gzip", packed), ("br", jsonlib.dumps(chat()).encode())):
        r = hostile.send(
            "POST",
            "/v1/chat/completions",
            content=content,
            headers={"content-type": "application/json", "content-encoding": encoding},
        )
        err = r.json()["error"]
        assert r.status_code == 415 and err["code"] == "unsupported_content_encoding", r.text
        assert encoding in err["message"] and err["param"] == "Content-Encoding", err
    plain = {"content-type": "application/json", "content-encoding": "identity"}
    r = hostile.send("POST", "/v1/chat/completions", content=jsonlib.dumps(chat()).encode(), headers=plain)
    assert r.status_code == 200, r.text
