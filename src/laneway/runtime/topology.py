"""The workers of one server as the core and the runtime see them: each worker's spec
(slots, the model it serves, KV space, isolation), the names it serves and is sent under,
the engines told each request's class, and the models placed by where their prompts are
cached."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from laneway.backends.base import Worker
from laneway.config.schema import ServerConfig
from laneway.core import WorkerSpec
from laneway.core.modes import PreemptionMode
from laneway.core.policies import policy as policy_spec

log = logging.getLogger("laneway.runtime")


@dataclass
class Topology:
    served: dict[str, str]  # worker -> the model it serves (laneway's name)
    upstream_model: dict[str, str]  # worker -> the model's name at its engine
    kv_tokens: dict[str, int | None]  # worker -> the KV space its configuration gives
    # engines told each request's class: upstreams asked to (vLLM's priority scheduling), and
    # the in-process engine (its prompts' chunks wait while more urgent work runs there)
    ranked: set[str]
    specs: list[WorkerSpec]
    # models served by several workers: where their prompts are cached decides between them
    placed_by_prefix: set[str]


def topology(config: ServerConfig, workers: Mapping[str, Worker]) -> Topology:
    """The topology of ``workers`` (built from ``config``'s workers), isolation that the
    policy cannot keep warned of."""
    served = {w.name: w.served_name for w in config.workers if w.name in workers}
    kv = {w.name: w.kv_tokens for w in config.workers}
    isolated = {w.name for w in config.workers if w.isolate}
    if isolated:
        _warn_isolation(sorted(isolated), config)
    specs = [
        WorkerSpec(
            name,
            slots=worker.capacity().slots,
            models=frozenset({served.get(name, name)}),
            can_checkpoint=worker.can_checkpoint,
            kv_tokens=kv.get(name),
            isolate=name in isolated,
        )
        for name, worker in workers.items()
    ]
    counts = Counter(served.get(name, name) for name in workers)
    return Topology(
        served,
        {w.name: w.model for w in config.workers if w.name in workers},
        kv,
        {w.name for w in config.workers if (w.forward_priority or w.type == "local") and w.name in workers},
        specs,
        {m for m, n in counts.items() if n > 1} if config.scheduler.placement == "prefix" else set(),
    )


def _warn_isolation(names: list[str], config: ServerConfig) -> None:
    """``isolate`` under a policy that cannot keep it: said at start, not found out later."""
    spec = policy_spec(config.policy)
    said = ("workers " if len(names) > 1 else "worker ") + ", ".join(names)
    if not spec.classes:
        log.warning("%s: isolate does nothing under policy %s (one queue, no classes)", said, spec.name)
    elif spec.preemption is PreemptionMode.NONE:
        log.warning(
            "%s: under policy %s (no preemption) isolate keeps batch work off a worker running "
            "urgent work, but urgent work starting beside batch work does not stop it",
            said,
            spec.name,
        )
