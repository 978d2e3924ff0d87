"""What the pass-through route answers when there is nothing to pass through: an unknown
route stays a 404 (405 where laneway serves the path with other methods), whatever the body;
and a body meant for an upstream's model that the strict reader refuses: a 400 naming it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from laneway.config import ServerConfig
from live_server import LiveServer, live_server, serving, upstream


def test_nothing_is_passed_through_without_an_upstreams_model(sim_server: LiveServer) -> None:
    url = sim_server.url
    cases = [
        ("POST", "/v1/messages", {"model": "sim", "max_tokens": 5, "messages": []}, 404),  # laneway's own
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
    # a model laneway serves itself: the 404 says why this path is not one of its
    said = httpx.post(url + "/v1/messages", json={"model": "sim", "messages": []}, timeout=30).json()
    assert "upstream workers only" in said["error"]["message"], said


def test_a_body_for_an_upstreams_model_is_read_as_strictly_as_any(tmp_path: Path) -> None:
    """(a number past a float's range, an unpaired surrogate: 400 on the field, not an unknown
    route; the upstream is sent nothing)"""
    sent: list[object] = []
    queries: list[str] = []

    heard: list[dict[str, str]] = []

    async def messages(request: Request) -> Response:
        sent.append(await request.json())
        queries.append(request.url.query)
        heard.append(dict(request.headers))
        return JSONResponse({"type": "message", "content": [{"type": "text", "text": "ok"}]})

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    routes = [Route("/v1/models", models, methods=["GET"]), Route("/v1/messages", messages, methods=["POST"])]
    app = Starlette(routes=routes)
    with serving(app) as url:
        cfg = replace(ServerConfig(), workers=(upstream("u", url),), data_dir=tmp_path)
        with live_server(cfg) as s:
            ask = b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]'
            ok = httpx.post(f"{s.url}/v1/messages", content=ask + b"}", timeout=30)
            assert ok.status_code == 200 and ok.json()["content"][0]["text"] == "ok", ok.text
            for extra, param in ((b', "temperature": 1e400}', "temperature"), (b', "x": "\\ud800"}', "x")):
                r = httpx.post(f"{s.url}/v1/messages", content=ask + extra, timeout=30)
                assert r.status_code == 400, r.text
                assert r.json()["error"]["param"] == param, r.text
            assert len(sent) == 1
            # a body with no model laneway could read stays an unknown route, saying why
            for content, why in (
                (b"not json", "its body is not a JSON object"),
                (b"", "its body is not a JSON object"),
                (b'{"messages": []}', "its body names no model an upstream worker serves"),
                (b'{"model": "x"}', "names no model an upstream worker serves (it names 'x')"),
            ):
                r = httpx.post(f"{s.url}/v1/messages", content=content, timeout=30)
                assert r.status_code == 404 and why in r.json()["error"]["message"], r.text
            deep = b'{"model": "m", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
            r = httpx.post(f"{s.url}/v1/messages", content=deep, timeout=30)  # (too deep to see its model)
            assert r.status_code == 400 and "nested" in r.json()["error"]["message"], r.text
            # Anthropic's version and betas go with it (headers); no other header of the client's
            said = {"anthropic-version": "2023-06-01", "anthropic-beta": "x-2025", "x-other": "no"}
            ok = httpx.post(f"{s.url}/v1/messages", content=ask + b"}", headers=said, timeout=30)
            assert ok.status_code == 200, ok.text
            assert heard[-1]["anthropic-version"] == "2023-06-01" and heard[-1]["anthropic-beta"] == "x-2025"
            assert "x-other" not in heard[-1] and "authorization" not in heard[-1]
            del sent[1:], queries[1:]
            # the query string goes with it, as sent (Anthropic's clients send ?beta=true)
            ok = httpx.post(f"{s.url}/v1/messages?beta=true", content=ask + b"}", timeout=30)
            assert ok.status_code == 200 and queries == ["", "beta=true"], queries
            del sent[1:]
            # one too large to read is refused as too large, as on any route (and not sent)
            big = ask + b', "x": "' + b"a" * (2 << 20) + b'"}'
            r = httpx.post(f"{s.url}/v1/messages", content=big, timeout=30)
            assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large", r.text
            assert len(sent) == 1
            # service_tier is the upstream's there (Anthropic's "standard_only"): sent, not read
            tiered = ask + b', "service_tier": "standard_only", "priority": "P0"}'
            ok = httpx.post(f"{s.url}/v1/messages", content=tiered, timeout=30)
            assert ok.status_code == 200, ok.text
            assert sent[-1]["service_tier"] == "standard_only" and "priority" not in sent[-1]  # type: ignore[index,operator]


def test_an_upstreams_refusal_of_a_passed_request_comes_back_as_it_wrote_it(tmp_path: Path) -> None:
    """Anthropic's clients read Anthropic's error shape (``{"type": "error", "error": …}``):
    an upstream's 4xx to a request passed through comes back as the upstream wrote it, its
    status and body (it was rewritten into OpenAI's shape); its 529 (Anthropic's
    "overloaded") is a busy upstream's: a 503 to come back later (it was a 502)."""
    shape = {"type": "error", "error": {"type": "invalid_request_error", "message": "tool_choice any"}}
    asked: list[str] = []

    async def messages(request: Request) -> Response:
        body = await request.json()
        asked.append(body["want"])
        if body["want"] == "refuse":
            return JSONResponse(shape, status_code=400)
        overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        return JSONResponse(overloaded, status_code=529)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    routes = [Route("/v1/models", models, methods=["GET"]), Route("/v1/messages", messages, methods=["POST"])]
    with serving(Starlette(routes=routes)) as url:
        worker = upstream("u", url)
        cfg = replace(ServerConfig(), workers=(worker,), data_dir=tmp_path, unavailable_hold_s=0.5)
        with live_server(cfg) as s:
            body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
            r = httpx.post(f"{s.url}/v1/messages", json={**body, "want": "refuse"}, timeout=30)
            assert r.status_code == 400 and r.json() == shape, r.text
            assert r.headers["content-type"].startswith("application/json")
            r = httpx.post(f"{s.url}/v1/messages", json={**body, "want": "busy"}, timeout=30)
            err = r.json()["error"]  # (its one worker busy, taken out: held, then come back later)
            assert r.status_code == 503 and "Overloaded (HTTP 529)" in err["message"], r.text
            assert err["code"] in ("upstream_unavailable", "no_healthy_worker"), err
            assert "Retry-After" in r.headers and asked.count("busy") >= 1, asked
