"""A worker whose engine is down is seen as down on ``/metrics`` and on the dashboard,
not as an idle one: ``laneway_worker_up`` 0, the dashboard's ``up`` false with why."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx

from laneway.config import parse_config
from laneway.testing import StandInProcess
from live_server import live_server


def up_gauge(url: str) -> float | None:
    text = httpx.get(url + "/metrics", timeout=5).text
    m = re.search(r'^laneway_worker_up\{worker="eng"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def dashboard_worker(url: str) -> dict[str, object]:
    with httpx.stream("GET", url + "/dashboard/events", timeout=10) as r:
        line = next(x for x in r.iter_lines() if x.startswith("data: "))
    workers = json.loads(line.removeprefix("data: "))["workers"]
    return next(w for w in workers if w["name"] == "eng")  # type: ignore[no-any-return]


def wait(check: object, what: str) -> None:
    deadline = time.monotonic() + 20
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_worker_whose_engine_is_down_is_down_on_metrics_and_the_dashboard(tmp_path: Path) -> None:
    engine = StandInProcess(tmp_path / "engine.log")
    worker = {"name": "eng", "type": "upstream", "url": engine.url, "model": "standin", "slots": 2}
    cfg = parse_config(
        {"server": {"data_dir": str(tmp_path / "d"), "probe_interval_s": 0.2}, "workers": [worker]}
    )
    try:
        with live_server(cfg) as s:
            wait(lambda: up_gauge(s.url) == 1.0, "in service at start")
            seen = dashboard_worker(s.url)
            assert seen["up"] is True and seen["down_because"] is None, seen
            engine.stop()
            wait(lambda: up_gauge(s.url) == 0.0, "taken out once its engine is gone")
            seen = dashboard_worker(s.url)
            assert seen["up"] is False and seen["slots"] == 2, seen
            assert isinstance(seen["down_because"], str) and seen["down_because"], seen
            engine = StandInProcess(tmp_path / "again.log", port=engine.port)
            wait(lambda: up_gauge(s.url) == 1.0, "back in service once its engine answers")
            assert dashboard_worker(s.url)["up"] is True
    finally:
        engine.stop()
