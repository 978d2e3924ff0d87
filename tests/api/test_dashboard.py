"""``/dashboard``: the live page, in a real browser (Debian's Chromium, driven by
Playwright) against a server under load — its numbers move — and its stream's
figures; the same key rules as ``/metrics``."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from laneway.config import hash_key, parse_config
from live_server import LiveServer, live_server

KEY = "ops-key"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def config(tmp: Path, **server: object) -> object:
    return parse_config(
        {
            "server": {"data_dir": str(tmp), **server},
            "workers": [
                {"name": "sim0", "type": "simulated", "model": "sim", "slots": 2, "tokens_per_s": 40}
            ],
            "tenants": {"team": {"key_sha256": [hash_key(KEY)]}},
        }
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(config(tmp_path_factory.mktemp("dash"))) as s:  # type: ignore[arg-type]
        yield s


def load(server: LiveServer, stop: threading.Event, sent: list[int]) -> None:
    """Requests of every class, a few at a time, until told to stop (at most 2 minutes)."""
    headers = {"Authorization": f"Bearer {KEY}"}
    ends = time.monotonic() + 120

    def one(i: int) -> None:
        body = {"model": "sim", "prompt": f"x{i}", "max_tokens": 20 + (i % 3) * 20, "priority": f"P{i % 4}"}
        httpx.post(server.base_url + "/completions", json=body, headers=headers, timeout=60)

    i = 0
    threads: list[threading.Thread] = []
    while not stop.is_set() and time.monotonic() < ends:
        t = threading.Thread(target=one, args=(i,))
        t.start()
        threads.append(t)
        sent.append(i)
        i += 1
        time.sleep(0.15)
    for t in threads:
        t.join(60)


def test_the_page_shows_live_numbers_in_a_browser(server: LiveServer, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "the browser test needs Debian's chromium (.ci/run installs it)"
    stop = threading.Event()
    sent: list[int] = []
    loader = threading.Thread(target=load, args=(server, stop, sent))
    loader.start()
    shot = tmp_path / "dashboard.png"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1200, "height": 900})
                page.goto(server.url + "/dashboard", wait_until="domcontentloaded")
                page.wait_for_function("document.getElementById('status').textContent.startsWith('live')")

                def figures() -> dict[str, object]:
                    return page.evaluate(
                        """() => ({
                          classes: [...document.querySelectorAll('#classes tbody tr')].map(
                            r => [...r.cells].map(c => c.textContent)),
                          workers: [...document.querySelectorAll('#workers tbody tr')].map(
                            r => [...r.cells].map(c => c.textContent)),
                          tenants: [...document.querySelectorAll('#tenants tbody tr')].map(
                            r => [...r.cells].map(c => c.textContent)),
                          recent: [...document.querySelectorAll('#recent tbody tr')].map(
                            r => [...r.cells].map(c => c.textContent)),
                          status: document.getElementById('status').textContent,
                        })"""
                    )

                seen: list[dict[str, object]] = []
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    seen.append(figures())
                    if len({json.dumps(f["tenants"]) for f in seen}) >= 3 and any(
                        any(cell.endswith(" tokens") for row in f["workers"] for cell in row)  # type: ignore[union-attr]
                        for f in seen
                    ):
                        break
                    time.sleep(0.5)
                page.screenshot(path=str(shot), full_page=True)
            finally:
                browser.close()
    finally:
        stop.set()
        loader.join(150)
    last = seen[-1]
    assert [row[0] for row in last["classes"]] == ["P0", "P1", "P2", "P3"]  # type: ignore[index]
    assert len({json.dumps(f["tenants"]) for f in seen}) >= 3  # the numbers move
    running = [row for f in seen for row in f["workers"] if row[8].endswith(" tokens")]  # type: ignore[union-attr]
    assert running and all(r[6] in ("P0", "P1", "P2", "P3") for r in running)  # class and progress
    # an engine in this process: no adapted concurrency, no prefix cache (upstreams have them)
    assert all(r[3:5] == ["—", "—"] for r in running if r[0]), running
    tenants = {row[0]: row for row in last["tenants"]}  # type: ignore[union-attr]
    assert "team" in tenants and int(tenants["team"][3]) > 0  # requests served to the tenant
    assert sum(int(row[1]) for row in last["recent"]) > 0  # type: ignore[union-attr]
    assert shot.stat().st_size > 10_000
    print(f"dashboard screenshot: {shot}")


def test_the_page_comes_with_its_figures_and_the_last_minutes_before_any_event(server: LiveServer) -> None:
    from playwright.sync_api import sync_playwright

    headers = {"Authorization": f"Bearer {KEY}"}
    for i in range(3):  # (done since the server started: the last 5 minutes count them)
        body = {"model": "sim", "prompt": f"y{i}", "max_tokens": 2, "priority": "P1"}
        assert httpx.post(server.base_url + "/completions", json=body, headers=headers, timeout=60).is_success
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.route("**/dashboard/events*", lambda route: route.abort())  # no event ever comes
            page.goto(server.url + "/dashboard", wait_until="load")
            got = page.evaluate(
                """() => ({
                  classes: [...document.querySelectorAll('#classes tbody tr')].map(
                    r => r.cells[0].textContent),
                  recent: [...document.querySelectorAll('#recent tbody tr')].map(
                    r => [...r.cells].map(c => c.textContent)),
                })"""
            )
        finally:
            browser.close()
    assert got["classes"] == ["P0", "P1", "P2", "P3"], got
    recent = {row[0]: int(row[1]) for row in got["recent"]}
    assert recent["P1"] >= 3, got  # (from the server's own history, not from 0 at page open)


def test_the_stream_has_the_figures(server: LiveServer) -> None:
    with httpx.stream("GET", server.url + "/dashboard/events", timeout=10) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        line = next(x for x in r.iter_lines() if x.startswith("data: "))
    snap = json.loads(line.removeprefix("data: "))
    assert [c["name"] for c in snap["classes"]] == ["P0", "P1", "P2", "P3"]
    assert snap["workers"][0]["name"] == "sim0" and snap["workers"][0]["slots"] == 2
    assert {"queued", "running", "oldest_wait_s", "estimate_s", "completed", "preemptions"} <= set(
        snap["classes"][0]
    )


def test_keys_as_for_metrics_and_off_when_asked(tmp_path: Path) -> None:
    with live_server(config(tmp_path / "a", ops_auth=True)) as s:  # type: ignore[arg-type]
        assert httpx.get(s.url + "/dashboard").status_code == 401
        assert httpx.get(s.url + "/metrics").status_code == 401
        assert httpx.get(s.url + "/dashboard", params={"key": "wrong"}).status_code == 401
        assert httpx.get(s.url + "/dashboard", params={"key": KEY}).status_code == 200
        ok = httpx.get(s.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200 and "laneway_queue_depth" in ok.text
    with live_server(config(tmp_path / "b", dashboard=False)) as s:  # type: ignore[arg-type]
        assert httpx.get(s.url + "/dashboard").status_code == 404
        assert httpx.get(s.url + "/metrics").status_code == 200


def test_the_root_leads_to_the_dashboard(server: LiveServer, tmp_path: Path) -> None:
    r = httpx.get(server.url + "/", params={"key": "k"})
    assert r.status_code == 307 and r.headers["location"] == "dashboard?key=k"
    assert httpx.get(server.url + "/", follow_redirects=True).text.startswith("<!doctype html>")
    with live_server(config(tmp_path / "off", dashboard=False)) as s:  # type: ignore[arg-type]
        assert httpx.get(s.url + "/").json()["api"].startswith("/v1")


def test_batches_and_their_progress_are_on_the_page(server: LiveServer) -> None:
    from playwright.sync_api import sync_playwright

    c = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=30)
    lines = [
        {"custom_id": f"d{i}", "method": "POST", "url": "/v1/completions",
         "body": {"model": "sim", "prompt": f"d{i}", "max_tokens": 40}}
        for i in range(8)
    ]  # fmt: skip
    f = c.files.create(
        file=("d.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode()), purpose="batch"
    )
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="1h")
    deadline = time.monotonic() + 30
    while c.batches.retrieve(b.id).status != "in_progress":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.route("**/dashboard/events*", lambda route: route.abort())  # the page's own figures
            page.goto(server.url + "/dashboard", wait_until="load")
            rows = page.evaluate(
                "() => [...document.querySelectorAll('#batches tbody tr')]"
                ".map(r => [...r.cells].map(c => c.textContent))"
            )
        finally:
            browser.close()
    [row] = [r for r in rows if r[0] == b.id]
    assert row[1:4] == ["team", "P2", "in_progress"] and row[4].endswith(" / 8"), row
    assert row[7].endswith("min")  # (expires within the hour)
    deadline = time.monotonic() + 60
    while c.batches.retrieve(b.id).status != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with httpx.stream("GET", server.url + "/dashboard/events", timeout=10) as r:
        line = next(x for x in r.iter_lines() if x.startswith("data: "))
    assert b.id not in {x["id"] for x in json.loads(line.removeprefix("data: "))["batches"]}  # ended: off it
