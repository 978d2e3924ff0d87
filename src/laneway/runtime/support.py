"""What serves each model: passed through to upstreams, or the features an engine here has."""

from __future__ import annotations

from collections.abc import Mapping

from laneway.backends.base import Worker
from laneway.generation import CHAT, COMPLETION, EMBEDDING
from laneway.protocol.requests import Support


def support_of(workers: Mapping[str, Worker], served: Mapping[str, str]) -> dict[str, Support]:
    """What serves each model: forwarded when every worker for it is an upstream, else the
    features all its engines implement."""
    by_model: dict[str, list[Worker]] = {}
    for name, worker in workers.items():
        by_model.setdefault(served.get(name, name), []).append(worker)
    out = {}
    for model, group in by_model.items():
        feats = [w.features for w in group]
        if all("passthrough" in f for f in feats):
            out[model] = Support(True, kinds=frozenset({CHAT, COMPLETION, EMBEDDING}))
        else:
            common = frozenset.intersection(*feats) - {"passthrough"}
            names = {w.engine_name for w in group}
            out[model] = Support(False, common, " or ".join(sorted(names)))
    return out
