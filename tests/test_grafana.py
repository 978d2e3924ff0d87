"""The Grafana dashboard shipped in deploy/grafana queries only what laneway exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from laneway.config import parse_config
from live_server import LiveServer, live_server

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "laneway-dashboard.json"
METRIC = re.compile(r"\blaneway_[a-z_]+\b")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    """The sample names a live server's /metrics has (after a request)."""
    cfg = parse_config(
        {
            "server": {"data_dir": str(tmp_path_factory.mktemp("grafana"))},
            "workers": [{"name": "sim0", "type": "simulated", "model": "sim", "slots": 1}],
        }
    )
    server: LiveServer
    with live_server(cfg) as server:
        body = {"model": "sim", "prompt": "x", "max_tokens": 2}
        assert httpx.post(server.base_url + "/completions", json=body, timeout=30).status_code == 200
        text = httpx.get(server.url + "/metrics").text
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    yield {line.split("{")[0].split(" ")[0] for line in samples}


def exprs(dashboard: dict[str, Any]) -> list[str]:
    out = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            out.append(query["query"])
    return out


def test_every_query_names_metrics_laneway_exports(exported: set[str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = exprs(dashboard)
    assert len(queries) >= 15
    used = {m for q in queries for m in METRIC.findall(q)}
    assert used, queries
    missing = sorted(used - exported)
    assert not missing, f"the dashboard queries metrics laneway does not export: {missing}"
    # it covers what an operator looks at: waits, first tokens, preemptions, rejections, slots, batches
    for family in (
        "laneway_queue_wait_seconds_bucket",
        "laneway_time_to_first_token_seconds_bucket",
        "laneway_preemptions_total",
        "laneway_rejections_total",
        "laneway_worker_slots_busy",
        "laneway_batch_lines_total",
    ):
        assert family in used, family


def test_the_panels_are_laid_out_without_overlap() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    cells: dict[tuple[int, int], int] = {}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, (p["title"], cells.get((x, y)))
                cells[(x, y)] = p["id"]


def test_a_workers_slots_are_not_summed_over_replicas() -> None:
    """Every replica of a cluster reports a shared worker's slots: summed over the replicas
    they would be as many times its slots as there are replicas (busy slots, queued and
    running requests are each replica's own: those are summed)."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    slot_queries = [q for q in exprs(dashboard) if re.search(r"\blaneway_worker_slots\{", q)]
    assert slot_queries
    for q in slot_queries:
        assert not re.search(r"\bsum(\s+by\s*\([^)]*\))?\s*\(\s*laneway_worker_slots\{", q), q
        assert re.search(r"\bmax by \(worker\) \(laneway_worker_slots\{", q), q
