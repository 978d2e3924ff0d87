"""Decisions: what the core tells the runtime (or the simulator) to do.

Plain immutable data (named tuples: cheap to make on the hot path). The core
never acts; whoever drives it applies these.
"""

from __future__ import annotations

from typing import NamedTuple


class Dispatch(NamedTuple):
    """Start (or resume) ``request_id`` on ``worker_id``.

    ``resume`` is ``None`` for a first start, else the mode its preemption used
    (``"checkpoint"``: restore saved state; ``"recompute"``: re-prefill).
    """

    request_id: str
    worker_id: str
    resume: str | None = None


class Preempt(NamedTuple):
    """Stop ``request_id`` at the next token boundary and save it by ``mode``.

    The runtime answers with ``Scheduler.preempted`` once the slot is free.
    """

    request_id: str
    worker_id: str
    mode: str  # "checkpoint" or "recompute"
    for_class: int


class Reject(NamedTuple):
    """The request ends without running.

    ``reason`` is one of :data:`REJECT_REASONS`; ``estimated_wait_s`` is the
    current estimate for its class (what a retry would face) and
    ``retry_after_s`` what to tell the client.
    """

    request_id: str
    reason: str
    message: str
    estimated_wait_s: float = 0.0
    retry_after_s: float = 0.0


class Load(NamedTuple):
    """Load ``model`` as a new replica ``replica_id`` on ``gpu_ids`` (one node).

    The GPUs' VRAM is held from now on; the replica takes work once the runtime
    answers ``Scheduler.loaded(replica_id, now)``, about ``load_s`` later.
    """

    replica_id: str
    model: str
    gpu_ids: tuple[str, ...]
    load_s: float


class Evict(NamedTuple):
    """Unload the idle replica ``replica_id``: its VRAM is free from now on."""

    replica_id: str
    model: str
    gpu_ids: tuple[str, ...]


REJECT_REASONS = (
    "queue_timeout",  # waited past its class timeout (503)
    "queue_full",  # its class queue is at its bound (503)
    "shed",  # overload: dropped to make room for more urgent work (503)
    "overloaded",  # overload and nothing less urgent to shed (503)
    "rate_limited",  # tenant token bucket empty (429)
    "concurrency",  # tenant at its in-flight or queued cap (429)
    "not_entitled",  # tenant may not use this class (403)
    "unplaceable",  # no worker could ever run it (404/400)
    "unavailable",  # no worker for its model is up now, nor came back while it was held (503)
)

Decision = Dispatch | Preempt | Reject | Load | Evict
