"""An upstream marked ``isolate``: an urgent request runs on its engine with no batch work
beside it (the stand-in engine's app in this process: laneway.backends.inprocess)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from laneway.api.dashboard import snapshot
from laneway.backends.factory import build_upstream
from laneway.backends.inprocess import InProcess
from laneway.config import load_config
from laneway.fault_harness import upstream_toml
from laneway.standin import StandIn
from live_server import live_server

BATCH_TOKENS = 150
MS_PER_TOKEN = 10


def config_file(tmp_path: Path, isolate: bool) -> Path:
    path = tmp_path / "laneway.toml"
    toml = f'[server]\ndata_dir = "{tmp_path / "data"}"\n'
    toml += upstream_toml("up0", "http://up0.invalid/v1", 4) + ("isolate = true\n" if isolate else "")
    path.write_text(toml)
    return path


def body(key: str, priority: str, tokens: int) -> dict[str, Any]:
    return {"model": "m", "prompt": f"#{key}# write on", "max_tokens": tokens, "priority": priority}


async def batch_then_urgent(url: str, engine: StandIn) -> tuple[list[dict[str, Any]], float, float]:
    """Two P3 requests; once both run, a P0: the P3s' answers and when the P0 was sent and
    answered (the stand-in's clock: time.time())."""
    async with httpx.AsyncClient(timeout=60) as client:
        batch = [
            asyncio.create_task(client.post(url + "/completions", json=body(f"b{i}", "P3", BATCH_TOKENS)))
            for i in range(2)
        ]
        for _ in range(500):  # (bounded: 5 s)
            if len(engine.running) == 2 and all(len(s.made) > 5 for s in engine.running):
                break
            await asyncio.sleep(0.01)
        assert len(engine.running) == 2
        sent = time.time()
        r = await client.post(url + "/completions", json=body("urgent", "P0", 20))
        answered = time.time()
        assert r.status_code == 200, r.text
        done = await asyncio.gather(*batch)
    assert [x.status_code for x in done] == [200, 200], [x.text for x in done]
    return [x.json() for x in done], sent, answered


def test_an_urgent_request_on_an_isolated_upstream_runs_alone_and_the_batch_resumes_after_it(
    tmp_path: Path,
) -> None:
    config = load_config(config_file(tmp_path, isolate=True))
    engine = StandIn(slots=4, ms_per_token=MS_PER_TOKEN)
    workers = {w.name: build_upstream(w, connect=InProcess(engine)) for w in config.workers}
    with live_server(config, workers) as server:
        answers, sent, answered = asyncio.run(batch_then_urgent(server.base_url, engine))
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        board = snapshot(server.runtime)  # type: ignore[arg-type]
    assert [(w["name"], w["isolate"]) for w in board["workers"]] == [("up0", True)]
    # the batch work was stopped for the P0 and resumed after it, to its whole length
    assert re.search(r'^laneway_preemptions_total\{class="P3"\} 2\.0$', metrics, re.M), metrics
    for a in answers:
        assert a["usage"]["completion_tokens"] == BATCH_TOKENS
        assert a["laneway"]["preemptions"] == 1
    spans = [s for s in engine.spans if s[0] in ("b0", "b1", "urgent")]
    (u_open, u_close) = next((o, c) for k, o, c in spans if k == "urgent")
    assert sent <= u_open <= u_close <= answered
    for key in ("b0", "b1"):
        runs = sorted((o, c) for k, o, c in spans if k == key)
        assert len(runs) == 2, runs  # stopped once, resumed once
        (_, c1), (o2, _) = runs
        assert c1 < u_open + 0.2, (c1, u_open)  # stopped as the P0 began (an abort's time)
        assert o2 >= u_close, (o2, u_close)  # and nothing of it ran beside the P0 after


def test_without_isolate_the_batch_runs_on_beside_the_urgent_request(tmp_path: Path) -> None:
    config = load_config(config_file(tmp_path, isolate=False))
    engine = StandIn(slots=4, ms_per_token=MS_PER_TOKEN)
    workers = {w.name: build_upstream(w, connect=InProcess(engine)) for w in config.workers}
    with live_server(config, workers) as server:
        answers, _, _ = asyncio.run(batch_then_urgent(server.base_url, engine))
        board = snapshot(server.runtime)  # type: ignore[arg-type]
    assert [(w["name"], w["isolate"]) for w in board["workers"]] == [("up0", False)]
    assert [a["laneway"]["preemptions"] for a in answers] == [0, 0]
    assert sorted(k for k, _, _ in engine.spans if k in ("b0", "b1")) == ["b0", "b1"]  # one run each


@pytest.mark.parametrize(
    ("policy", "said"),
    [
        ("fifo", "isolate does nothing under policy fifo"),
        ("priority", "under policy priority (no preemption) isolate keeps batch work off"),
        ("laneway", None),
    ],
)
def test_a_policy_that_cannot_keep_isolation_says_so_at_start(
    tmp_path: Path, policy: str, said: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    path = config_file(tmp_path, isolate=True)
    path.write_text(path.read_text().replace("[server]\n", f'[server]\npolicy = "{policy}"\n'))
    config = load_config(path)
    engine = StandIn(slots=4, ms_per_token=0)
    workers = {w.name: build_upstream(w, connect=InProcess(engine)) for w in config.workers}
    with caplog.at_level(logging.WARNING, logger="laneway.runtime"), live_server(config, workers):
        pass
    lines = [r.getMessage() for r in caplog.records if "isolate" in r.getMessage()]
    assert len(lines) == (0 if said is None else 1), lines
    assert said is None or (said in lines[0] and "worker up0:" in lines[0]), lines
