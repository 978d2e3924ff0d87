"""Every error status of DESIGN §3, in OpenAI's error shape."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from laneway.config import hash_key, parse_config
from live_server import LiveServer, live_server

ALICE, BOB = "alice-key", "bob-key"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One slow slot; alice may use P1–P3 (P1 at a tiny rate), bob anything; P2 times out fast."""
    cfg = parse_config(
        {
            "server": {"max_body_bytes": 2048, "data_dir": str(tmp_path_factory.mktemp("keyed"))},
            "classes": {"P2": {"timeout_s": 0.3}},
            "workers": [
                {"name": "sim0", "type": "simulated", "model": "sim", "slots": 1, "tokens_per_s": 100}
            ],
            "tenants": {
                "alice": {
                    "key_sha256": [hash_key(ALICE)],
                    "allowed": ["P1", "P2", "P3"],
                    "default_priority": "P3",
                    "quotas": {"P1": {"rate_per_s": 0.01, "burst": 1}},
                },
                "bob": {"key_sha256": [hash_key(BOB)]},
            },
        }
    )
    with live_server(cfg) as server:
        yield server


def post(
    server: LiveServer, body: object, key: str | None = BOB, path: str = "/chat/completions", **kw: object
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.base_url + path, json=body, headers=headers, timeout=30, **kw)  # type: ignore[arg-type]


def chat(max_tokens: int = 2, **extra: object) -> dict[str, object]:
    return {
        "model": "sim",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        **extra,
    }


def error_of(resp: httpx.Response, status: int) -> dict[str, object]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert {"message", "type", "code", "param"} <= set(err)
    assert isinstance(err["message"], str) and err["message"]
    return err


def test_400_invalid_requests(keyed: LiveServer) -> None:
    err = error_of(post(keyed, chat(temperature=5)), 400)
    assert err["type"] == "invalid_request_error" and err["param"] == "temperature"
    err = error_of(post(keyed, chat(priority="P9")), 400)
    assert err["param"] == "priority"
    err = error_of(post(keyed, {"model": "sim"}), 400)
    assert err["param"] == "messages"
    resp = httpx.post(
        keyed.base_url + "/chat/completions", content=b"{nope", headers={"Authorization": f"Bearer {BOB}"}
    )
    assert "not valid JSON" in error_of(resp, 400)["message"]  # type: ignore[operator]
    err = error_of(post(keyed, chat(), path="/completions"), 400)
    assert err["param"] == "prompt"
    for bad in (
        {"continue_final_message": True},  # the last message is the user's
        {"continue_final_message": True, "add_generation_prompt": True},
        {"add_generation_prompt": False},
        {"continue_final_message": "yes"},
    ):
        err = error_of(post(keyed, chat(**bad)), 400)
        assert err["param"] in ("continue_final_message", "add_generation_prompt")
    for messages, param in (
        ([{"content": "no role"}], "messages[0].role"),
        ([{"role": "wizard", "content": "x"}], "messages[0].role"),
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "user", "content": None}], "messages[0].content"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        ([{"role": "user", "content": {"a": 1}}], "messages[0].content"),
        ([{"role": "user", "content": "ok"}, {"role": "user", "content": ["hi"]}], "messages[1].content"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages[0].content"),
    ):
        err = error_of(post(keyed, {**chat(), "messages": messages}), 400)
        assert err["param"] == param, (messages, err)
    for extra, param in (
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true, at that
    ):
        assert error_of(post(keyed, chat(**extra)), 400)["param"] == param
    completion = {"model": "sim", "prompt": "x", "max_tokens": 2}
    unsupported = (({"logprobs": 3}, "logprobs"), ({"echo": True}, "echo"), ({"best_of": 2}, "best_of"))
    for extra, param in unsupported:
        assert error_of(post(keyed, {**completion, **extra}, path="/completions"), 400)["param"] == param
    ok = post(keyed, chat(tools=[], logprobs=False))  # empty or off: nothing asked that is not done
    assert ok.status_code == 200, ok.text
    c = openai.OpenAI(base_url=keyed.base_url, api_key=BOB, max_retries=0)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="sim", messages=[{"role": "user", "content": "x"}], top_p=1.5)
    # (top_p 0 is OpenAI's too: the most likely token)
    said = c.chat.completions.create(model="sim", messages=[{"role": "user", "content": "x"}], top_p=0)
    assert said.choices


def test_401_without_or_with_a_bad_key(keyed: LiveServer) -> None:
    err = error_of(post(keyed, chat(), key=None), 401)
    assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key"
    error_of(post(keyed, chat(), key="wrong"), 401)
    error_of(httpx.get(keyed.base_url + "/models"), 401)
    c = openai.OpenAI(base_url=keyed.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        c.models.list()


def test_anthropics_x_api_key_header_is_a_key_too(keyed: LiveServer) -> None:
    """Anthropic's clients send their key as ``x-api-key`` (to ``/v1/messages``, relayed to an
    upstream, and checked as every route checks it): the same key, the same tenant."""
    url = keyed.base_url + "/chat/completions"
    ok = httpx.post(url, json=chat(), headers={"x-api-key": BOB}, timeout=30)
    assert ok.status_code == 200, ok.text
    refused = httpx.post(url, json=chat(priority="P0"), headers={"x-api-key": ALICE}, timeout=30)
    assert refused.status_code == 403, refused.text  # (alice's own limits hold)
    assert httpx.post(url, json=chat(), headers={"x-api-key": "wrong"}, timeout=30).status_code == 401
    messages = {"model": "sim", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    gone = httpx.post(keyed.base_url + "/messages", json=messages, headers={"x-api-key": "wrong"}, timeout=30)
    assert gone.status_code == 401, gone.text
    err = error_of(post(keyed, chat(), key=None), 401)
    assert "x-api-key" in err["message"]
    # two different keys (two tenants, or a proxy's key beside its client's) are refused, not
    # one taken at a guess; the same key twice is one
    for headers in (
        [("authorization", f"Bearer {BOB}"), ("authorization", f"Bearer {ALICE}")],
        [("authorization", f"Bearer {ALICE}"), ("x-api-key", BOB)],
    ):
        twice = httpx.post(url, json=chat(), headers=headers, timeout=30)
        assert twice.status_code == 401 and "2 different API keys" in twice.json()["error"]["message"]
        assert BOB not in twice.text and ALICE not in twice.text
    same = [("authorization", f"Bearer {BOB}"), ("x-api-key", BOB)]
    assert httpx.post(url, json=chat(), headers=same, timeout=30).status_code == 200


def test_403_class_not_allowed(keyed: LiveServer) -> None:
    err = error_of(post(keyed, chat(priority="P0"), key=ALICE), 403)
    assert err["code"] == "class_not_allowed" and err["type"] == "permission_error"
    ok = post(keyed, chat(), key=ALICE)  # alice's default class
    assert ok.status_code == 200 and ok.json()["laneway"]["priority"] == "P3"


def test_404_unknown_model_and_route(keyed: LiveServer) -> None:
    err = error_of(post(keyed, {**chat(), "model": "gpt-9"}), 404)
    assert err["code"] == "model_not_found" and err["param"] == "model"
    err = error_of(httpx.get(keyed.url + "/v1/nothing"), 404)
    assert err["code"] == "not_found"
    # a trailing slash is another route: a 404 in OpenAI's shape, not a redirect
    assert error_of(post(keyed, chat(), path="/chat/completions/"), 404)["code"] == "not_found"
    auth = {"Authorization": f"Bearer {BOB}"}
    assert httpx.get(keyed.base_url + "/models/sim", headers=auth).json()["id"] == "sim"
    err = error_of(httpx.get(keyed.base_url + "/models/org/gpt-9", headers=auth), 404)
    assert err["code"] == "model_not_found"
    c = openai.OpenAI(base_url=keyed.base_url, api_key=BOB, max_retries=0)
    assert c.models.retrieve("sim").id == "sim"
    error_of(
        httpx.get(
            keyed.base_url + "/queue/estimate",
            params={"model": "gpt-9"},
            headers={"Authorization": f"Bearer {BOB}"},
        ),
        404,
    )


def test_405_wrong_method(keyed: LiveServer) -> None:
    resp = httpx.get(keyed.base_url + "/chat/completions")
    assert error_of(resp, 405)["code"] == "method_not_allowed"
    assert "POST" in resp.headers["allow"]


def test_413_too_large(keyed: LiveServer) -> None:
    big = chat(messages=[{"role": "user", "content": "x" * 5000}])
    assert error_of(post(keyed, big), 413)["code"] == "payload_too_large"


def test_429_quota_with_retry_after(keyed: LiveServer) -> None:
    assert post(keyed, chat(priority="P1"), key=ALICE).status_code == 200
    resp = post(keyed, chat(priority="P1"), key=ALICE)
    err = error_of(resp, 429)
    assert err["code"] == "rate_limited" and err["type"] == "rate_limit_error"
    assert int(resp.headers["retry-after"]) >= 1
    # the wait it announces is when the bucket refills, and Retry-After says the same
    wait = err["estimated_wait_s"]
    assert isinstance(wait, float) and 90 < wait <= 100.0  # (a bucket of 1 per 100 s here)
    assert int(resp.headers["retry-after"]) == max(1, math.ceil(wait))
    c = openai.OpenAI(base_url=keyed.base_url, api_key=ALICE, max_retries=0)
    with pytest.raises(openai.RateLimitError):
        c.chat.completions.create(
            model="sim", messages=[{"role": "user", "content": "x"}], extra_body={"priority": 1}
        )


def test_503_queue_timeout_with_estimate(keyed: LiveServer) -> None:
    blocker: list[httpx.Response] = []
    t = threading.Thread(target=lambda: blocker.append(post(keyed, chat(max_tokens=100, priority="P1"))))
    t.start()
    try:
        deadline = time.monotonic() + 10
        while keyed.runtime.sched.free_slots and time.monotonic() < deadline:
            time.sleep(0.01)
        for stream in (False, True):  # a streaming request still gets a plain 503 before any text
            resp = post(keyed, chat(priority="P2", stream=stream))
            err = error_of(resp, 503)
            assert err["code"] == "queue_timeout" and err["type"] == "server_error"
            wait = err["estimated_wait_s"]
            assert isinstance(wait, float) and wait > 0
            assert int(resp.headers["retry-after"]) == max(1, math.ceil(wait))  # the estimate
    finally:
        t.join(30)
    assert blocker[0].status_code == 200
