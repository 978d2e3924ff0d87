"""What the pass-through route answers when there is nothing to pass through: an unknown
route stays a 404 (405 where laneway serves the path with other methods), whatever the body."""

from __future__ import annotations

import httpx

from live_server import LiveServer


def test_nothing_is_passed_through_without_an_upstreams_model(sim_server: LiveServer) -> None:
    url = sim_server.url
    cases = [
        ("POST", "/v1/messages", {"model": "sim", "max_tokens": 5, "messages": []}, 404),  # a built-in model
        ("POST", "/v1/messages", {"model": "nobody", "messages": []}, 404),
        ("POST", "/v1/rerank", {"query": "no model"}, 404),
        ("POST", "/v1/rerank", b"not json", 404),
        ("GET", "/v1/messages", None, 404),
        ("DELETE", "/v1/messages", None, 404),
        ("POST", "/v1/chat/completions/", {"model": "sim", "messages": []}, 404),
        ("POST", "/v1//messages", {"model": "sim"}, 404),
        ("POST", "/v1/models", {"model": "sim"}, 405),
        ("DELETE", "/v1/files", None, 405),
        ("PUT", "/v1/chat/completions", {"model": "sim"}, 405),
    ]
    for method, path, body, status in cases:
        kw = {"content": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
        r = httpx.request(method, url + path, timeout=30, **kw)  # type: ignore[arg-type]
        assert r.status_code == status, (method, path, r.text)
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and path.split("?")[0] in error["message"], error
