"""Requests from the browser pages of other origins (laneway.api.guard): refused unless
allowed, before they do anything; allowed ones get CORS."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from laneway.config import parse_config
from laneway.core import ConfigError
from live_server import LiveServer, live_server, sim_config

BODY = {"model": "sim", "prompt": "hi", "max_tokens": 2}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with live_server(sim_config(tmp_path)) as s:
        yield s


def test_a_foreign_pages_post_is_refused_before_it_runs(server: LiveServer) -> None:
    url = server.base_url + "/completions"
    for origin in ("https://evil.example", "null", "http://127.0.0.1:1"):
        # (text/plain: what a page may send without a preflight)
        r = httpx.post(
            url,
            content=b'{"model": "sim", "prompt": "hi"}',
            headers={"origin": origin, "content-type": "text/plain"},
        )
        assert r.status_code == 403, r.text
        err = r.json()["error"]
        assert err["code"] == "cross_origin" and "allowed_origins" in err["message"]
    assert not server.runtime.tickets
    own = server.url  # the page laneway serves itself (the dashboard) is of this origin
    assert httpx.post(url, json=BODY, headers={"origin": own}).status_code == 200
    assert httpx.post(url, json=BODY).status_code == 200  # clients that are not browsers send none
    r = httpx.get(server.base_url + "/models", headers={"origin": "https://evil.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers  # (unreadable there)
    r = httpx.request("DELETE", server.base_url + "/files/file-x", headers={"origin": "https://evil.example"})
    assert r.status_code == 403
    twice = [("origin", "https://evil.example"), ("origin", own)]  # (the last one is not the one)
    assert httpx.post(url, json=BODY, headers=twice).status_code == 403


def test_a_page_of_a_name_rebound_to_loopback_is_foreign(server: LiveServer) -> None:
    """DNS rebinding: evil.example made to resolve to 127.0.0.1; its page's requests carry
    its own name as both Origin and Host. A server on 127.0.0.1 answers to loopback names."""
    url = server.base_url + "/completions"
    port = server.url.rsplit(":", 1)[1]
    rebound = {"origin": f"http://evil.example:{port}", "host": f"evil.example:{port}"}
    r = httpx.post(url, json=BODY, headers=rebound)
    assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin"
    local = {"origin": f"http://localhost:{port}", "host": f"localhost:{port}"}
    assert httpx.post(url, json=BODY, headers=local).status_code == 200


def test_the_names_a_server_answers_to() -> None:
    from laneway.api.guard import own_names

    assert own_names("0.0.0.0") is None and own_names("::") is None  # (reachable under any name)
    assert {"localhost", "127.0.0.1", "[::1]"} <= (own_names("127.0.0.1") or set())
    assert own_names("10.0.0.5") == {"10.0.0.5", "[10.0.0.5]"}


def test_an_allowed_origin_gets_cors(tmp_path: Path) -> None:
    app_origin = "https://app.example.com"
    config = replace(sim_config(tmp_path), allowed_origins=(app_origin,))
    with live_server(config) as s:
        url = s.base_url + "/completions"
        pre = httpx.options(
            url,
            headers={
                "origin": app_origin,
                "access-control-request-method": "POST",
                "access-control-request-headers": "content-type, authorization",
            },
        )
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == app_origin
        r = httpx.post(url, json=BODY, headers={"origin": app_origin})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == app_origin
        assert httpx.post(url, json=BODY, headers={"origin": "https://other.example"}).status_code == 403
        # a preflight refused is an error in OpenAI's shape too
        refused = httpx.options(
            url, headers={"origin": "https://other.example", "access-control-request-method": "POST"}
        )
        assert refused.status_code == 400 and refused.headers["content-type"] == "application/json"
        error = refused.json()["error"]
        assert error["code"] == "cors_disallowed" and "origin" in error["message"]
        assert set(error) >= {"message", "type", "param", "code"}


def test_allowed_origins_in_the_configuration() -> None:
    cfg = parse_config({"server": {"allowed_origins": ["https://App.example.com", "*"]}})
    assert cfg.allowed_origins == ("https://app.example.com", "*")
    assert parse_config({}).allowed_origins == ()
    for bad in (["app.example.com"], ["https://a.example/"], [1], "https://a.example"):
        with pytest.raises(ConfigError, match=r"^server\.allowed_origins"):
            parse_config({"server": {"allowed_origins": bad}})
