"""The window of an upstream's concurrency: halved when its engine is saturated, one more
when it keeps up with all it is given; what an engine's /metrics say of it."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import httpx
import pytest

from laneway.backends.base import EngineState
from laneway.backends.capabilities import STATE_GAUGES, sglang_kv_tokens_in, state_in
from laneway.backends.factory import build_upstream
from laneway.backends.inprocess import InProcess
from laneway.config import load_config
from laneway.core import ConfigError
from laneway.fault_harness import upstream_toml
from laneway.runtime.engine_watch import HitCount
from laneway.runtime.saturation import KV_FULL, REPROBE, SETTLE_S, Window
from laneway.standin import StandIn
from live_server import LiveServer, live_server


def test_an_engine_that_queues_is_given_what_it_runs_and_the_rest_is_taken_back() -> None:
    w = Window(slots=16, floor=2, limit=16)
    # laneway sent 16, the engine runs 4 and queues 12: 4 at once, 12 to take back
    assert w.observe(EngineState(4, 12), in_flight=16, now=10.0) == 4
    assert (w.ceiling, w.take_back, w.saturated) == (4, 12, True)
    # its gauges lag the requests taken back: no second cut while they settle
    assert w.observe(EngineState(4, 12), in_flight=4, now=10.0 + SETTLE_S / 2) == 4
    assert w.take_back == 0
    # a queue that is not laneway's (it runs all laneway sends): halved, never under the floor
    assert w.observe(EngineState(6, 3), in_flight=4, now=20.0) == 2
    assert w.observe(EngineState(6, 3), in_flight=2, now=30.0) == 2
    assert w.take_back == 0  # (nothing of laneway's over the limit)
    # its KV cache is full: halved
    w = Window(slots=16, floor=1, limit=8)
    assert w.observe(EngineState(8, 0, KV_FULL), in_flight=8, now=0.0) == 4 and w.take_back == 0


def test_the_limit_grows_back_to_its_ceiling_and_past_it_only_to_reprobe() -> None:
    w = Window(slots=8, floor=1, limit=8)
    assert w.observe(EngineState(3, 5), in_flight=8, now=0.0) == 3  # (3 is its ceiling)
    w.observe(EngineState(2, 0, 0.5), in_flight=1, now=5.0)
    assert w.limit == 3  # not all used: as it is
    w.limit = 2  # (say it was lower)
    assert w.observe(EngineState(2, 0, 0.5), in_flight=2, now=6.0) == 3  # all used: one more
    readings = 0
    while w.limit == 3 and readings < 2 * REPROBE:
        w.observe(EngineState(3, 0, 0.5), in_flight=3, now=7.0 + readings)
        readings += 1
    assert w.limit == 4 and w.ceiling is None  # once, after REPROBE readings at the ceiling
    assert REPROBE - 2 <= readings <= REPROBE
    for i in range(10):  # it took more: it grows again, to its slots at most
        w.observe(EngineState(w.limit, 0, 0.5), in_flight=w.limit, now=100.0 + i)
    assert w.limit == 8


def test_an_engine_is_read_soon_only_when_sent_more_than_it_was_seen_to_run() -> None:
    w = Window(slots=8, floor=1, limit=8)
    assert w.unproven(1)  # nothing seen yet
    w.observe(EngineState(3, 0, 0.1), in_flight=3, now=0.0)
    assert not w.unproven(3) and w.unproven(4)
    w.observe(EngineState(3, 2), in_flight=5, now=1.0)  # cut to 3: its ceiling
    assert not w.unproven(3) and w.unproven(4)


def test_min_slots_is_at_most_slots(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[[workers]]\nname = "up0"\ntype = "upstream"\nurl = "http://127.0.0.1:9/v1"\nmodel = "m"\n'
        "slots = 2\nmin_slots = 3\n"
    )
    with pytest.raises(ConfigError, match=r"workers\[0\]\.min_slots: must be at most slots \(2\)"):
        load_config(path)
    path.write_text(path.read_text().replace("min_slots = 3", "min_slots = 2\nadapt_slots = false"))
    with pytest.raises(ConfigError, match=r"workers\[0\]\.min_slots: .* with adapt_slots = false"):
        load_config(path)  # (it did nothing there)


VLLM_METRICS = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="0",model_name="other"} 7.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1200.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 800.0
"""


def test_an_engines_state_has_its_load_and_its_prefix_cache_counters() -> None:
    assert state_in(VLLM_METRICS, "m", STATE_GAUGES["vllm"]) == EngineState(3, 1, 0.25, 1200.0, 800.0)
    sglang = "sglang:num_running_reqs 2\nsglang:num_queue_reqs 0\n"
    assert state_in(sglang, "m", STATE_GAUGES["sglang"]) == EngineState(2, 0)  # (no counters said)
    # SGLang's prefix counters: every prompt token, and those found cached (by where)
    sglang = (
        'sglang:num_running_reqs{model_name="m"} 1.0\nsglang:num_queue_reqs{model_name="m"} 4.0\n'
        'sglang:token_usage{model_name="m"} 0.5\n'
        'sglang:prompt_tokens_total{model_name="m",is_streaming="true"} 900.0\n'
        'sglang:prompt_tokens_total{model_name="m",is_streaming="false"} 100.0\n'
        'sglang:cached_tokens_total{model_name="m",cache_source="device"} 600.0\n'
        'sglang:cached_tokens_total{model_name="m",cache_source="host"} 50.0\n'
        'sglang:max_total_num_tokens{model_name="m"} 262144.0\n'
    )
    assert state_in(sglang, "m", STATE_GAUGES["sglang"]) == EngineState(1, 4, 0.5, 1000.0, 650.0)
    assert sglang_kv_tokens_in(sglang) == 262144 and sglang_kv_tokens_in("sglang:x 1\n") is None
    assert state_in("# nothing\n", "m", STATE_GAUGES["vllm"]) is None


def test_figures_that_are_no_counts_are_not_believed_and_a_timestamp_is_read_past() -> None:
    """(a NaN running gauge logged a traceback at every probe; an Inf prefix counter made the
    dashboard's JSON invalid): an engine whose figures are not counts has none."""
    gauges = STATE_GAUGES["vllm"]
    for bad in ("NaN", "+Inf", "-Inf", "-7", "1e308"):
        for name in ("num_requests_running", "num_requests_waiting", "prefix_cache_hits_total"):
            text = re.sub(
                rf"^(vllm:{name}\{{engine=\"0\",model_name=\"m\"\}}) \S+$",
                rf"\1 {bad}",
                VLLM_METRICS,
                flags=re.M,
            )
            assert text != VLLM_METRICS
            assert state_in(text, "m", gauges) is None, (name, bad)
    over = VLLM_METRICS.replace(
        'kv_cache_usage_perc{engine="0",model_name="m"} 0.25',
        'kv_cache_usage_perc{engine="0",model_name="m"} 5.0',
    )
    assert over != VLLM_METRICS
    assert state_in(over, "m", gauges) == EngineState(
        3, 1, None, 1200.0, 800.0
    )  # (500 % of its cache: not said)
    stamped = VLLM_METRICS.replace('model_name="m"} 3.0', 'model_name="m"} 3.0 1700000000000')
    assert stamped != VLLM_METRICS
    assert state_in(stamped, "m", gauges) == EngineState(3, 1, 0.25, 1200.0, 800.0)


def test_the_reported_hit_rate_counts_from_the_first_reading_and_anew_after_a_restart() -> None:
    count = HitCount(1000.0, 900.0, 1000.0, 900.0)
    assert count.ratio is None  # nothing asked since laneway first read it
    count.update(1400.0, 1000.0)
    assert count.ratio == pytest.approx(100 / 400)
    count.update(300.0, 240.0)  # its engine restarted: its counters began again at 0
    assert count.ratio == pytest.approx(240 / 300)
    count.update(400.0, 5000.0)  # (more found than looked up: no engine's figure, bounded)
    assert count.ratio == 1.0


def test_a_burst_past_what_the_engine_runs_is_gated_and_taken_back_before_the_next_probe(
    tmp_path: Path,
) -> None:
    """12 slots in front of a stand-in engine that runs 4 (its own queue beyond): a burst of
    12 long requests queues 8 inside it. Laneway reads its gauges a quarter second after
    sending it more than it had seen it run (the next probe is 30 s away), cuts it to the 4
    it runs and takes the 8 it queued back; a P0 sent then goes first in laneway's queue
    and never waits inside the engine; every request ends, each with all its tokens."""
    path = tmp_path / "laneway.toml"
    path.write_text(
        f'[server]\ndata_dir = "{tmp_path / "data"}"\nprobe_interval_s = 30\n'
        + upstream_toml("up0", "http://up0.invalid/v1", 12)
    )
    config = load_config(path)
    engine = StandIn(slots=4, ms_per_token=10)
    workers = {w.name: build_upstream(w, connect=InProcess(engine)) for w in config.workers}

    async def main(url: str, server: LiveServer) -> tuple[list[int], float, dict[str, int]]:
        window = server.runtime.engines.saturation.windows["up0"]
        seen = {"open_in_engine": 0, "queued_here": 0, "limit": 12}
        async with httpx.AsyncClient(timeout=60) as client:

            async def one(i: int, priority: str, tokens: int) -> int:
                body = {"model": "m", "prompt": f"job {i}", "max_tokens": tokens, "priority": priority}
                r = await client.post(url + "/completions", json=body)
                assert r.status_code == 200, r.text
                return int(r.json()["usage"]["completion_tokens"])

            flood = [asyncio.ensure_future(one(i, "P3", 300)) for i in range(12)]
            t0 = time.monotonic()
            # (bounded well under the next probe, 30 s away: what reads it is the quick read)
            while time.monotonic() - t0 < 10.0 and not (window.limit == 4 and engine.open_requests() == 4):
                await asyncio.sleep(0.02)
            seen["limit"] = window.limit
            seen["open_in_engine"] = engine.open_requests()
            seen["queued_here"] = server.runtime.sched.queued
            t1 = time.monotonic()
            assert await one(99, "P0", 2) == 2
            urgent_s = time.monotonic() - t1
            return list(await asyncio.gather(*flood)), urgent_s, seen

    with live_server(config, workers) as server:
        made, urgent_s, seen = asyncio.run(main(server.base_url, server))
    assert made == [300] * 12
    assert seen == {"limit": 4, "open_in_engine": 4, "queued_here": 8}, seen  # (none in its queue)
    assert urgent_s < 6.0  # (behind the engine's own queue it would wait for 4 runs of 3 s)
    assert engine.peak_requests <= 12
