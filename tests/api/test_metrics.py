"""/metrics: Prometheus names present, and moving as requests are served."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from laneway.config import hash_key, parse_config
from live_server import LiveServer, live_server

NAMES = (
    "laneway_queue_depth",
    "laneway_queue_wait_seconds_bucket",
    "laneway_time_to_first_token_seconds_bucket",
    "laneway_request_duration_seconds_bucket",
    "laneway_preemptions_total",
    "laneway_rejections_total",
    "laneway_worker_slots_busy",
    "laneway_worker_slots",
    "laneway_checkpoint_bytes_total",
    "laneway_checkpoint_bytes_held",
    "laneway_queue_wait_alerts_total",
    "laneway_queue_wait_alert_threshold_seconds",
    "laneway_queue_oldest_wait_seconds",
    "laneway_requests_total",
)


def value(text: str, sample: str) -> float:
    m = re.search(r"^" + re.escape(sample) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_metric_names_present_and_moving(sim_server: LiveServer) -> None:
    before = httpx.get(sim_server.url + "/metrics")
    assert before.status_code == 200 and before.headers["content-type"].startswith("text/plain")
    for name in NAMES:
        assert re.search(r"^" + name + r"[{ ]", before.text, re.M), name
    assert value(before.text, 'laneway_queue_wait_alert_threshold_seconds{class="P0"}') == 10.0
    assert "_created" not in before.text  # no creation-time samples posing as metrics
    body = {"model": "sim", "prompt": "x", "max_tokens": 2, "priority": "P2"}
    for _ in range(3):
        assert httpx.post(sim_server.base_url + "/completions", json=body).status_code == 200
    httpx.post(sim_server.base_url + "/completions", json={**body, "model": "nope"})
    after = httpx.get(sim_server.url + "/metrics").text
    for sample in (
        'laneway_queue_wait_seconds_count{class="P2"}',
        'laneway_time_to_first_token_seconds_count{class="P2"}',
        'laneway_request_duration_seconds_count{class="P2"}',
        'laneway_requests_total{class="P2",outcome="completed"}',
    ):
        assert value(after, sample) - value(before.text, sample) == 3, sample
    assert value(after, 'laneway_worker_slots{worker="sim0"}') == 2


def test_a_request_refused_on_arrival_counts_as_one_ended_rejected(tmp_path: Path) -> None:
    """One refused at once (its expected wait past its class's timeout) is counted as one
    refused after it queued is: a rejection of its reason, and a request ended rejected."""
    cfg = parse_config(
        {
            "server": {"data_dir": str(tmp_path)},
            "classes": {"P1": {"timeout_s": 2}},
            "workers": [{"name": "s", "type": "simulated", "model": "sim", "slots": 1, "tokens_per_s": 20}],
        }
    )
    with live_server(cfg) as s, httpx.Client(base_url=s.base_url, timeout=30) as c:
        hog = {"model": "sim", "prompt": "x", "max_tokens": 200, "priority": "P3", "preemptible": False}
        with c.stream("POST", "/completions", json={**hog, "stream": True}) as held:
            next(held.iter_lines())  # (it runs: 10 s, not to be preempted)
            before = c.get(s.url + "/metrics").text
            urgent = {"model": "sim", "prompt": "y", "max_tokens": 2, "priority": "P1"}
            got = c.post("/completions", json=urgent)
            assert got.status_code == 503 and got.json()["error"]["code"] == "queue_timeout", got.text
            after = c.get(s.url + "/metrics").text
    for sample in (
        'laneway_requests_total{class="P1",outcome="rejected"}',
        'laneway_rejections_total{reason="queue_timeout"}',
    ):
        assert value(after, sample) == value(before, sample) + 1, sample


def test_a_request_its_engine_refused_counts_as_a_rejection_of_its_reason(tmp_path: Path) -> None:
    """One that an upstream answered 4xx before any token ends rejected (its tenant charged
    nothing): it is counted among the rejections too, so that those by reason add up."""
    from laneway.testing import StandInProcess

    engine = StandInProcess(tmp_path / "engine.log")
    try:
        cfg = parse_config(
            {
                "server": {"data_dir": str(tmp_path / "d")},
                "workers": [{"name": "up", "type": "upstream", "model": "standin", "url": engine.url}],
            }
        )
        with live_server(cfg) as s, httpx.Client(base_url=s.base_url, timeout=30) as c:
            before = c.get(s.url + "/metrics").text
            got = c.post("/completions", json={"model": "standin", "prompt": ["a", "b"], "max_tokens": 2})
            assert got.status_code == 400, got.text
            after = c.get(s.url + "/metrics").text
    finally:
        engine.stop()
    for sample in (
        'laneway_requests_total{class="P1",outcome="rejected"}',
        'laneway_rejections_total{reason="engine_refused"}',
    ):
        assert value(after, sample) == value(before, sample) + 1, sample


def test_each_tenant_has_its_requests_rejections_and_tokens(tmp_path: Path) -> None:
    """Per tenant: requests ended by outcome, refusals by reason (a quota's 429 among them),
    the tokens of those that completed; a request of no tenant counts under ``""``."""
    cfg = parse_config(
        {
            "server": {"data_dir": str(tmp_path)},
            "tenants": {
                "acme": {"key_sha256": [hash_key("k-acme")]},
                "tiny": {
                    "key_sha256": [hash_key("k-tiny")],
                    "quotas": {"P1": {"rate_per_s": 0.001, "burst": 1}},
                },
            },
            "workers": [{"name": "s", "type": "simulated", "model": "sim", "slots": 2, "tokens_per_s": 500}],
        }
    )
    body = {"model": "sim", "prompt": "x", "max_tokens": 3, "priority": "P1"}
    with live_server(cfg) as s, httpx.Client(base_url=s.base_url, timeout=30) as c:
        for key in ("k-acme", "k-acme", "k-tiny"):
            got = c.post("/completions", json=body, headers={"Authorization": f"Bearer {key}"})
            assert got.status_code == 200, got.text
        got = c.post("/completions", json=body, headers={"Authorization": "Bearer k-tiny"})
        assert got.status_code == 429 and got.json()["error"]["code"] == "rate_limited", got.text
        text = c.get(s.url + "/metrics").text
    assert value(text, 'laneway_tenant_requests_total{outcome="completed",tenant="acme"}') == 2
    assert value(text, 'laneway_tenant_requests_total{outcome="completed",tenant="tiny"}') == 1
    assert value(text, 'laneway_tenant_requests_total{outcome="rejected",tenant="tiny"}') == 1
    assert value(text, 'laneway_tenant_rejections_total{reason="rate_limited",tenant="tiny"}') == 1
    assert value(text, 'laneway_rejections_total{reason="rate_limited"}') == 1
    assert value(text, 'laneway_tenant_tokens_total{kind="completion",tenant="acme"}') == 6
    assert value(text, 'laneway_tenant_tokens_total{kind="prompt",tenant="acme"}') > 0


def test_time_to_first_token_is_to_a_token_not_to_a_role_sent_first(tmp_path: Path) -> None:
    """An engine that sends the role in a chunk of its own at once (the stand-in does) has
    not made a token by then: the histogram counted ~1 ms where clients saw text at 60 ms."""
    from dataclasses import replace

    from laneway.config import ServerConfig
    from laneway.standin import StandIn
    from live_server import serving, upstream

    with serving(StandIn("standin", slots=1, ms_per_token=60.0)) as url:
        cfg = replace(ServerConfig(), workers=(upstream("up", url, model="standin"),), data_dir=tmp_path)
        with live_server(cfg) as s:
            body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
            with httpx.stream("POST", s.base_url + "/chat/completions", json={**body, "stream": True}) as r:
                assert r.status_code == 200 and '"role":"assistant"' in r.read().decode().replace(" ", "")
            text = httpx.get(s.url + "/metrics").text
    assert value(text, 'laneway_time_to_first_token_seconds_count{class="P1"}') == 1
    assert value(text, 'laneway_time_to_first_token_seconds_sum{class="P1"}') >= 0.05  # (a token: 60 ms)
