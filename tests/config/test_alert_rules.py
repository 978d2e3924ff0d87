"""The shipped Prometheus rules use the same thresholds as the server's defaults."""

from __future__ import annotations

import re
from pathlib import Path

from laneway.config.schema import DEFAULT_ALERT_WAIT_S

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "laneway-alerts.yml"


def test_rule_thresholds_match_defaults() -> None:
    text = RULES.read_text(encoding="utf-8")
    found = dict(re.findall(r'laneway_queue_oldest_wait_seconds\{class="(P\d)"\}\) > (\d+)', text))
    expected = {f"P{i}": t for i, t in enumerate(DEFAULT_ALERT_WAIT_S) if t is not None}
    assert {k: float(v) for k, v in found.items()} == expected
    assert "laneway_queue_wait_alerts_total" in text
