"""The window of an upstream's concurrency: halved when its engine is saturated, one more
when it keeps up with all it is given."""

from __future__ import annotations

from pathlib import Path

import pytest

from laneway.backends.base import EngineState
from laneway.config import load_config
from laneway.core import ConfigError
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
