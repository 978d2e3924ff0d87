"""The window of an upstream's concurrency: halved when its engine is saturated, one more
when it keeps up with all it is given; what an engine's /metrics say of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from laneway.backends.base import EngineState
from laneway.backends.capabilities import STATE_GAUGES, sglang_kv_tokens_in, state_in
from laneway.config import load_config
from laneway.core import ConfigError
from laneway.runtime.engine_watch import HitCount
from laneway.runtime.saturation import KV_FULL, Saturation, Window


def test_saturated_halves_to_the_floor_and_keeping_up_adds_one_to_the_ceiling() -> None:
    w = Window(slots=8, floor=2, limit=8)
    assert w.observe(EngineState(4, 3), in_flight=8) == 4  # it queues: halve
    assert w.observe(EngineState(4, 1), in_flight=8) == 2
    assert w.observe(EngineState(2, 1), in_flight=6) == 2  # (never under the floor)
    assert w.observe(EngineState(2, 0, KV_FULL), in_flight=2) == 2  # its KV cache is full
    assert w.observe(EngineState(2, 0, 0.5), in_flight=2) == 3  # drained, all used: one more
    assert w.observe(EngineState(2, 0, 0.5), in_flight=2) == 3  # not all used: as it is
    for _ in range(10):
        w.observe(EngineState(8, 0, 0.5), in_flight=w.limit)
    assert w.limit == 8  # (never over its slots)


def test_an_engine_that_says_nothing_keeps_its_slots() -> None:
    s = Saturation({"up0": Window(4, 1, 4)})
    assert s.observe("up0", None, 4) is None and s.windows["up0"].limit == 4
    assert s.observe("other", EngineState(1, 5), 4) is None  # (a worker that does not adapt)
    assert s.observe("up0", EngineState(4, 2), 4) == 2


def test_min_slots_is_at_most_slots(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[[workers]]\nname = "up0"\ntype = "upstream"\nurl = "http://127.0.0.1:9/v1"\nmodel = "m"\n'
        "slots = 2\nmin_slots = 3\n"
    )
    with pytest.raises(ConfigError, match=r"workers\[0\]\.min_slots: must be at most slots \(2\)"):
        load_config(path)


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


def test_the_reported_hit_rate_counts_from_the_first_reading_and_anew_after_a_restart() -> None:
    count = HitCount(1000.0, 900.0, 1000.0, 900.0)
    assert count.ratio is None  # nothing asked since laneway first read it
    count.update(1400.0, 1000.0)
    assert count.ratio == pytest.approx(100 / 400)
    count.update(300.0, 240.0)  # its engine restarted: its counters began again at 0
    assert count.ratio == pytest.approx(240 / 300)
