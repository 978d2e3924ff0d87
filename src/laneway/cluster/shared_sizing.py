"""A replica's request sizing with the pace every replica of the cluster measured."""

from __future__ import annotations

import math
from collections.abc import Callable

from laneway.cluster.codec import Event, Pace
from laneway.runtime.sizing import Sizing


class SharedSizing(Sizing):
    """A replica's request sizing, with the pace measured by every replica: each
    observation also goes to the leader (an ``o`` event), whose figures per model
    (published with the estimates) replace this replica's own. A replica that has served
    nothing of a model yet sizes its requests as the others measured them, so the
    leader's estimates (and the refusals made on them) do not depend on which replica
    a client reached."""

    def __init__(self, base: Sizing, emit: Callable[[Event], None]) -> None:
        super().__init__(base.costs, base.default_max_tokens, base.context_of)
        self.decode_tokens_s = dict(base.decode_tokens_s)
        self._emit = emit
        self._seen: dict[str, list[float]] = {}  # model -> [tokens after the first, seconds]
        self._told: set[str] = set()  # models whose pace this replica has sent

    def observe(self, model: str, tokens: int, seconds: float) -> None:
        super().observe(model, tokens, seconds)
        if tokens >= 2 and seconds > 0:
            if model not in self._told:  # the first of a model at once (the others size by it)
                self._told.add(model)
                self._emit(Pace(model, tokens, seconds))
                return
            seen = self._seen.setdefault(model, [0.0, 0.0])
            seen[0] += tokens - 1
            seen[1] += seconds

    def send(self) -> None:
        """What was measured since the last call, one event per model (its pace over all)."""
        for model, (tokens, seconds) in self._seen.items():
            self._emit(Pace(model, int(tokens) + 1, seconds))
        self._seen = {}

    def adopt(self, pace: dict[str, float]) -> None:
        for model, rate in pace.items():
            if isinstance(rate, int | float) and math.isfinite(rate) and rate > 0:
                self.decode_tokens_s[model] = float(rate)
