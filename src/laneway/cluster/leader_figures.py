"""What the cluster's leader publishes a few times a second (``PREFIX est``) —
:func:`estimates`, as it makes them, and :class:`LeaderFigures`, as a replica reads them: the
estimated waits and their intervals per class (and model), the queued and
running counts, the leader's name, the pace every replica measured, where the fleet's
engines are and the models failing to start. A figure that is missing or malformed is
left out: a replica goes on with what it had."""

from __future__ import annotations

import math
import time
from typing import Any

from laneway.core import Scheduler, WaitRange


def estimates(core: Scheduler, models: list[str], now: float) -> dict[str, Any]:
    """The leader's figures of ``core`` now: each class's (and each class and model's)
    estimated wait and its interval, the queued and running counts (JSON, infinities as
    ``null``)."""
    wait: dict[str, float | None] = {}
    ranges: dict[str, list[Any]] = {}
    for i, name in enumerate(core.classes.names):
        for key, model in [(name, None)] + [(f"{name}|{m}", m) for m in models]:
            w, r = core.estimate_range(i, model, now)
            wait[key] = w if math.isfinite(w) else None
            high = r.high_s if math.isfinite(r.high_s) else None
            ranges[key] = [r.low_s if math.isfinite(r.low_s) else None, high, r.basis, r.detail]
    snap = core.snapshot()
    return {"wait": wait, "range": ranges, "queued": snap.queue_depth, "running": snap.running}


class LeaderFigures:
    def __init__(self) -> None:
        self._waits: dict[str, float | None] = {}
        self._ranges: dict[str, list[Any]] = {}
        self.queued: dict[str, int] = {}
        self.running: dict[str, int] = {}
        self.leader: str | None = None  # (the leader that published them)
        self.pace: dict[str, Any] | None = None  # model -> tokens a second (the last read's)
        self.fleet: dict[str, Any] | None = None  # where the leader placed what (the last read's)
        # models failing to start -> (why, seconds until tried again) (the last read's)
        self.failing: dict[str, tuple[str, float]] | None = None

    def read(self, fig: dict[str, Any]) -> LeaderFigures:
        """Take the figures ``fig`` (the published JSON object); returns itself."""
        self._waits = dict(fig.get("wait", {}))
        self._ranges = {k: v for k, v in fig.get("range", {}).items() if isinstance(v, list) and len(v) == 4}
        self.queued = fig.get("queued", {})
        self.running = fig.get("running", {})
        self.leader = fig.get("leader")
        pace = fig.get("pace")
        self.pace = pace if isinstance(pace, dict) else None
        fleet = fig.get("fleet")
        self.fleet = fleet if isinstance(fleet, dict) and isinstance(fleet.get("replicas"), dict) else None
        failing = fig.get("failing")
        self.failing = None
        if isinstance(failing, dict):
            now = time.time()
            self.failing = {
                str(m): (str(v[0]), float(v[1]) - now)
                for m, v in failing.items()
                if isinstance(v, list) and len(v) == 2 and isinstance(v[1], int | float)
            }
        return self

    def wait(self, class_name: str, model: str | None) -> float:
        """The estimated wait of a request of ``class_name`` for ``model`` (the class's own
        where the model has none), ``inf`` where the leader gave none."""
        got = self._waits.get(f"{class_name}|{model or ''}", self._waits.get(class_name))
        return math.inf if got is None else got

    def range(self, class_name: str, model: str | None) -> WaitRange:
        """That wait's interval."""
        got = self._ranges.get(f"{class_name}|{model or ''}", self._ranges.get(class_name))
        if got is None:
            return WaitRange(0.0, math.inf, "none", "the leader has published no estimate yet")
        low, high, basis, detail = got
        low = 0.0 if low is None else float(low)
        return WaitRange(low, math.inf if high is None else float(high), str(basis), str(detail))
