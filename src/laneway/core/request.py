"""The request model and its lifecycle.

A request moves through the states of :class:`State` along the edges of
:data:`TRANSITIONS` only; :func:`transition` enforces that. Inside a class the
total order is ``(arrival_s, seq)``: the same input always schedules the same
way.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from laneway.core.errors import InvalidTransition
from laneway.core.modes import StopMode


class State(enum.Enum):
    NEW = "new"  # built by the caller, not yet submitted
    QUEUED = "queued"
    RUNNING = "running"
    PREEMPTED = "preempted"  # told to stop; its slot frees when the worker acknowledges
    FINISHED = "finished"
    FAILED = "failed"
    REJECTED = "rejected"  # refused at admission or shed from the queue
    EXPIRED = "expired"  # queue timeout
    CANCELLED = "cancelled"

    # members are singletons: identity hashing keeps the transition check cheap
    __hash__ = object.__hash__


TERMINAL = frozenset({State.FINISHED, State.FAILED, State.REJECTED, State.EXPIRED, State.CANCELLED})

TRANSITIONS: dict[State, frozenset[State]] = {
    # (a request found running by a scheduler that takes over from one that failed is
    # adopted: new -> running)
    State.NEW: frozenset({State.QUEUED, State.REJECTED, State.RUNNING}),
    State.QUEUED: frozenset({State.RUNNING, State.EXPIRED, State.CANCELLED, State.REJECTED}),
    State.RUNNING: frozenset({State.PREEMPTED, State.FINISHED, State.FAILED, State.CANCELLED}),
    # A worker may finish (or fail) the request before it sees the preemption.
    State.PREEMPTED: frozenset({State.QUEUED, State.FINISHED, State.FAILED, State.CANCELLED}),
    State.FINISHED: frozenset(),
    State.FAILED: frozenset(),
    State.REJECTED: frozenset(),
    State.EXPIRED: frozenset(),
    State.CANCELLED: frozenset(),
}


def transition(req: Request, new: State) -> None:
    """Move ``req`` to ``new`` or raise :class:`InvalidTransition`."""
    if new not in TRANSITIONS[req.state]:
        raise InvalidTransition(f"request {req.id}: {req.state.value} -> {new.value} is not allowed")
    req.state = new


@dataclass(slots=True, eq=False)
class Request:
    """One inference request as the scheduler sees it.

    The caller fills the first block of fields; the scheduler owns the rest.
    ``timeout_s`` overrides the class's queue timeout (``math.inf``: none).
    ``est_service_s`` is an optional hint of the service time (for example
    from ``max_tokens``); without it the scheduler uses measured service times.
    """

    id: str
    priority: int
    arrival_s: float
    model: str | None = None
    tenant: str | None = None
    preemptible: bool = True
    timeout_s: float | None = None
    est_service_s: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    depends_on: tuple[str, ...] = ()
    prefix: tuple[int, ...] = ()  # its prompt's chain of block hashes (laneway.runtime.prefix)

    # --- owned by the scheduler -------------------------------------------
    state: State = State.NEW
    seq: int = -1
    cls: int = -1  # effective class: native priority, raised by inheritance
    level: int = 0  # multi-level feedback level (mlfq policy)
    gen: int = 0  # queue-entry generation, for lazy deletion from lanes
    lane: int = -1  # the lane it is (or was last) queued in
    deadline_s: float = math.inf  # queue-timeout deadline (never-started requests)
    est_s: float = 0.0  # expected service time used for estimates
    worker: str | None = None
    started_s: float = math.nan  # start of the current run
    expected_end_s: float = math.nan  # when the current run is expected to end
    preempt_at_s: float = math.nan  # when the current preemption was decided
    first_start_s: float = math.nan
    enqueued_s: float = math.nan  # when it last entered the queue
    queued_total_s: float = 0.0  # time spent queued over all visits
    run_s: float = 0.0  # service received before the current run
    tokens_done: int = 0  # output tokens generated before the current run
    prefilled: bool = False  # its first output token came (its prompt was prefilled)
    prefill_left: int = 0  # prompt tokens its worker likely still prefills (prefix placement)
    cached_blocks: int = 0  # of its prefix, the blocks its worker held before it came (prefix placement)
    checkpoint_bytes: int = 0
    preemptions: int = 0
    lost_s: float = 0.0  # slot time its preemptions cost so far (save + restore, or re-prefill)
    est_raw_s: float = math.nan  # the raw wait estimate on arrival, if one was made to learn from
    range_s: tuple[float, float] | None = None  # ... its interval then (from now), if calibrated
    range_judged: bool = False  # whether the wait was found in or out of that interval yet
    tag: float = 0.0  # its order inside its class (laneway.core.fairness; else its arrival)
    fair_charged: float = 0.0  # weighted tokens its tenant was charged for it so far
    tokens_charged: int = 0  # output tokens charged to its tenant's token quota so far
    resume: StopMode | None = None  # how its next dispatch resumes it (how it was stopped)
    claimed_for: int | None = None  # a more urgent class waits for this slot
    claim_deadline_s: float = math.inf  # drain claims turn into preemption after this
    inherited: int | None = None
    waiters: set[str] | None = None  # live requests that depend on this one

    @property
    def started(self) -> bool:
        return not math.isnan(self.first_start_s)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.tokens_done
