"""``laneway serve --log-format json --log-level --access-log``: one JSON object per line,
start-up facts at INFO, one line per request with its fields."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from laneway import logs
from laneway.testing import ServeProcess
from test_cli_serve import SIM_CONFIG

CONFIG = (
    SIM_CONFIG
    + '[tenants.team]\nkey_sha256 = ["{key}"]\n[tenants.team.quotas.P3]\nrate_per_s = 0.01\nburst = 1\n'
)


def test_json_server_log(tmp_path: Path) -> None:
    from laneway.config import hash_key

    cfg = tmp_path / "laneway.toml"
    cfg.write_text(CONFIG.format(data=tmp_path / "data", key=hash_key("k")), encoding="utf-8")
    args = ["--config", str(cfg), "--log-format", "json", "--access-log"]
    server = ServeProcess(args, tmp_path / "serve.log")
    try:
        r = httpx.post(
            server.url + "/v1/completions",
            json={"model": "sim", "prompt": "x", "max_tokens": 3, "priority": "P2"},
            headers={"Authorization": "Bearer k"},
        )
        assert r.status_code == 200
        rid = r.json()["id"]
        httpx.get(server.url + "/dashboard?key=k&view=1")  # (a browser's address: its key)
        upgrade = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Key": "dGhlIHNhbXBsZQ=="}
        assert httpx.get(server.url + "/healthz", headers=upgrade).status_code == 200  # (served as any)
        for code in (200, 429):  # (a refusal as it arrives is a line too: it ends rejected)
            p3 = {"model": "sim", "prompt": "x", "max_tokens": 3, "priority": "P3"}
            r = httpx.post(server.url + "/v1/completions", json=p3, headers={"Authorization": "Bearer k"})
            assert r.status_code == code, r.text
        # a stream its client leaves after some tokens: its line says how many it made
        long = {"model": "sim", "prompt": "x", "max_tokens": 100_000, "priority": "P2", "stream": True}
        with httpx.stream(
            "POST", server.url + "/v1/completions", json=long, headers={"Authorization": "Bearer k"}
        ) as r:
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data: ")
                if seen == 5:
                    break
            assert seen == 5
        deadline = time.monotonic() + 20
        while '"status": "cancelled"' not in server.text():
            assert time.monotonic() < deadline, server.text()[-2000:]
            time.sleep(0.05)
    finally:
        server.stop()
    records = [json.loads(line) for line in server.text().splitlines() if line.strip()]  # every line JSON
    assert all({"ts", "level", "logger", "message"} <= set(x) for x in records)
    messages = [x["message"] for x in records]
    assert any(m.startswith("serving sim on http://127.0.0.1:") for m in messages)
    assert any(m.startswith("worker sim0: simulated") for m in messages)  # start-up facts
    assert any(m == "tenants: team" for m in messages)
    req, _, refused, left = [x for x in records if x["logger"] == "laneway.requests"]
    assert left["status"] == "cancelled" and 0 < left["completion_tokens"] < 100_000, left
    assert refused["status"] == "rejected" and refused["priority"] == "P3" and refused["tenant"] == "team"
    assert req["request_id"] == rid and req["tenant"] == "team" and req["priority"] == "P2"
    assert req["worker"] == "sim0" and req["status"] == "completed" and req["completion_tokens"] == 3
    assert req["queue_ms"] >= 0 and req["preemptions"] == 0
    assert any(x["logger"] == "uvicorn.access" for x in records)
    assert any("/dashboard?key=…&view=1" in m for m in messages)  # the access line, its key hidden
    assert "key=k" not in server.text()
    assert "upgrade" not in server.text().lower()  # (no warning a client can make it write)
    assert any("shutting down" in m for m in messages)


@pytest.fixture
def logging_restored() -> Iterator[None]:
    """logs.setup changes the process's logging: put it back for the tests after."""
    names = ["", "uvicorn", "uvicorn.error", "uvicorn.access", "laneway.requests"]
    saved = []
    for name in names:
        lg = logging.getLogger(name)
        saved.append((lg, list(lg.handlers), lg.level, lg.propagate, lg.disabled))
    try:
        yield
    finally:
        for lg, handlers, level, propagate, disabled in saved:
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.propagate, lg.disabled = propagate, disabled
        logs._json = False


def test_request_lines_only_when_asked(capsys: pytest.CaptureFixture[str], logging_restored: None) -> None:
    logs.setup("info", "json", requests=False)
    logs.request_ended("r1", None, "P1", "w", 0.01, 0, "completed", 1, 2)
    logs.setup("warning", "text", requests=True)
    logs.request_ended("r2", "t", "P1", "w", 0.01, 1, "failed", None, None)
    logging.getLogger("laneway.x").info("not at warning")
    err = capsys.readouterr().err
    assert "r1" not in err and "not at warning" not in err
    assert "laneway.requests: r2 failed P1 on w: queued 10.0 ms, 1 preemptions, -+- tokens" in err
    with pytest.raises(ValueError, match="log level"):
        logs.setup("loud", "text")


def test_the_url_said_at_start_is_a_url_for_an_ipv6_address_too() -> None:
    from laneway.serve import base_url

    assert base_url("127.0.0.1", 8000) == "http://127.0.0.1:8000"
    assert base_url("::1", 8000) == "http://[::1]:8000" and base_url("::", 80) == "http://[::]:80"


def test_a_repeated_warning_is_logged_once_a_period_with_its_count(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A loop retrying every 200 ms while Redis is away: the first warning, then one every
    ``every_s`` saying how many came between, and once that it works again."""
    clock = [100.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: clock[0])
    logger = logging.getLogger("laneway.test.repeated")
    repeated = logs.Repeated(logger, every_s=10.0)
    with caplog.at_level(logging.WARNING, logger="laneway.test.repeated"):
        repeated.ok("fine again")  # (nothing was wrong: nothing said)
        for _ in range(60):  # 12 s of retries
            repeated.warn("cannot read: %s", "down")
            clock[0] += 0.2
        repeated.ok("reads again")
        repeated.ok("reads again")
        repeated.warn("cannot read: %s", "down")
    assert [r.getMessage() for r in caplog.records] == [
        "cannot read: down",
        "cannot read: down (and 49 times more in the last 10 s)",
        "reads again",
        "cannot read: down",
    ]
