"""``[batches]`` in the server configuration."""

from __future__ import annotations

import pytest

from laneway.config import BatchConfig, parse_config
from laneway.core import ConfigError


def test_defaults_and_overrides() -> None:
    assert parse_config({}).batches == BatchConfig()
    cfg = parse_config(
        {"batches": {"default_priority": "P3", "max_lines": 10, "max_in_flight": 4, "poll_s": 0.5}}
    )
    assert (cfg.batches.default_priority, cfg.batches.max_lines, cfg.batches.max_in_flight) == (3, 10, 4)
    assert cfg.batches.poll_s == 0.5 and cfg.batches.lease_s == 60.0


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"max_lines": 0}, "batches.max_lines: must be >= 1"),
        ({"default_priority": "P7"}, "batches.default_priority: unknown class"),
        ({"lease_s": -1}, "batches.lease_s: must be > 0"),
        ({"max_file_bytes": 10}, "batches.max_file_bytes: must be >= 1024"),
        ({"nope": 1}, "batches.nope: unknown key"),
    ],
)
def test_mistakes_name_the_key(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"batches": table})
