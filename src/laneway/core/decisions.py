"""Decisions: what the core tells the runtime (or the simulator) to do.

Plain immutable data (named tuples: cheap to make on the hot path). The core
never acts; whoever drives it applies these, through :func:`apply` and an
:class:`Actuator` of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple, Protocol

from laneway.core.modes import StopMode


class Dispatch(NamedTuple):
    """Start (or resume) ``request_id`` on ``worker_id``.

    ``resume`` is ``None`` for a first start, else the mode its preemption used
    (``"checkpoint"``: restore saved state; ``"recompute"``: re-prefill).
    """

    request_id: str
    worker_id: str
    resume: StopMode | None = None


class Preempt(NamedTuple):
    """Stop ``request_id`` at the next token boundary and save it by ``mode``.

    The runtime answers with ``Scheduler.preempted`` once the slot is free.
    """

    request_id: str
    worker_id: str
    mode: StopMode
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
    answers ``Scheduler.loaded(replica_id, now)``, about ``load_s`` later. ``wake``:
    the replica is one put to sleep before (``Evict(sleep=True)``), woken where it was
    (its engine's sleep mode: ``load_s`` is its wake time, not a cold start).
    """

    replica_id: str
    model: str
    gpu_ids: tuple[str, ...]
    load_s: float
    wake: bool = False


class Evict(NamedTuple):
    """Unload the idle replica ``replica_id``: its VRAM is free from now on.

    ``sleep``: put its engine to sleep instead (its weights leave the GPUs for host memory;
    a later ``Load(wake=True)`` wakes it). An ``Evict`` of a replica asleep already
    stops its engine.
    """

    replica_id: str
    model: str
    gpu_ids: tuple[str, ...]
    sleep: bool = False


class LoadAdapter(NamedTuple):
    """Load LoRA ``adapter`` (of the model replica ``replica_id`` serves) into that replica's
    engine, about ``load_s``; the ``Dispatch`` that follows at once runs once it is in."""

    replica_id: str
    adapter: str
    load_s: float


class UnloadAdapter(NamedTuple):
    """Unload LoRA ``adapter`` from replica ``replica_id``'s engine (it runs nothing of it)."""

    replica_id: str
    adapter: str


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
    "model_unavailable",  # a fleet's model whose engine could not be started, for a back-off (503)
)

Decision = Dispatch | Preempt | Reject | Load | Evict | LoadAdapter | UnloadAdapter


class Actuator(Protocol):
    """Whoever carries out decisions: the server's runtime, the simulator, a cluster's
    leader (which passes them on to the replicas). One method per kind of decision, each
    given the clock value of the step that made it; :func:`apply` is the one loop that
    hands decisions to them."""

    def dispatch(self, d: Dispatch, now: float) -> None: ...

    def preempt(self, d: Preempt, now: float) -> None: ...

    def reject(self, d: Reject, now: float) -> None: ...

    def load(self, d: Load, now: float) -> None: ...

    def evict(self, d: Evict, now: float) -> None: ...

    def load_adapter(self, d: LoadAdapter, now: float) -> None: ...

    def unload_adapter(self, d: UnloadAdapter, now: float) -> None: ...


def apply(decisions: Iterable[Decision], to: Actuator, now: float) -> None:
    """Carry out ``decisions``, in order, with ``to``."""
    for d in decisions:
        kind = type(d)
        if kind is Dispatch:
            to.dispatch(d, now)  # type: ignore[arg-type]
        elif kind is Preempt:
            to.preempt(d, now)  # type: ignore[arg-type]
        elif kind is Reject:
            to.reject(d, now)  # type: ignore[arg-type]
        elif kind is Load:
            to.load(d, now)  # type: ignore[arg-type]
        elif kind is Evict:
            to.evict(d, now)  # type: ignore[arg-type]
        elif kind is LoadAdapter:
            to.load_adapter(d, now)  # type: ignore[arg-type]
        elif kind is UnloadAdapter:
            to.unload_adapter(d, now)  # type: ignore[arg-type]
        else:
            raise TypeError(f"not a decision: {d!r}")
