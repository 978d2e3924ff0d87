"""The one surface between the runtime (which runs jobs and holds the clients'
streams) and whatever schedules them.

The runtime sends its events through it — arrivals, ends, preemptions done,
cancels, requeues, progress, worker health — and takes decisions
(``Dispatch`` / ``Preempt`` / ``Reject``) from :meth:`SchedulerPort.schedule`.
Two implementations:

- in one process, the core itself (:class:`laneway.core.Scheduler`): each
  event is a method call and a decision comes back in the same step;
- in a cluster, :class:`laneway.cluster.remote.RemoteScheduler`: events go to
  the leader's stream in Redis and the leader's decisions for this replica's
  requests come back from Redis, handed out by ``schedule`` like the core's.

The runtime is the same code either way: a server without ``[cluster]`` does
exactly what it did before clusters existed, and needs no Redis.
"""

from __future__ import annotations

from typing import Protocol

from laneway.core import Decision, Reject, Request, WaitRange
from laneway.core.stats import Snapshot


class SchedulerPort(Protocol):
    # ------------------------------------------------------------ events
    def submit(self, req: Request, now: float) -> Reject | None:
        """A request arrives; its refusal now, if it is refused at once."""
        ...

    def finished(
        self,
        request_id: str,
        now: float,
        *,
        failed: bool = False,
        tokens: int | None = None,
        prompt_tokens: int | None = None,
    ) -> None:
        """It ended (``failed``: with an error) having made ``tokens`` output tokens from
        a prompt of ``prompt_tokens`` (0: refused by the engine before it ran)."""
        ...

    def preempted(
        self,
        request_id: str,
        now: float,
        *,
        tokens_done: int | None = None,
        checkpoint_bytes: int | None = None,
        save_s: float | None = None,
    ) -> None: ...

    def cancel(self, request_id: str, now: float, *, tokens: int | None = None) -> bool:
        """It was cancelled wherever it is, having made ``tokens`` output tokens."""
        ...

    def requeue(self, request_id: str, now: float, *, failed: bool = False) -> None: ...

    def progress(self, request_id: str, tokens: int, now: float) -> None: ...

    def first_token(self, request_id: str, now: float) -> bool:
        """It made its first output token (its prompt is prefilled). Whether a scheduling
        step is due (work kept off its worker until then may start)."""
        ...

    def set_available(self, worker_id: str, available: bool) -> None: ...

    def set_slots(self, worker_id: str, n: int) -> None:
        """``worker_id`` may run ``n`` requests at once (1 to its slots)."""
        ...

    def set_kv_tokens(self, worker_id: str, tokens: int) -> None:
        """The engine of ``worker_id`` holds ``tokens`` of KV cache (it bounds its prefix cache)."""
        ...

    def cache_lost(self, worker_id: str) -> None:
        """The engine of ``worker_id`` lost its prefix cache (it restarted)."""
        ...

    def withdraw(
        self, request_id: str, now: float, reason: str, message: str, retry_after_s: float
    ) -> Reject: ...

    # ------------------------------------------------------------ decisions
    def schedule(self, now: float) -> list[Decision]: ...

    def next_wakeup(self) -> float:
        """When ``schedule`` has something to do again with no event (``inf``: never)."""
        ...

    # ------------------------------------------------------------ figures
    def estimate_wait(
        self,
        cls: int,
        model: str | None,
        now: float,
        est_service_s: float | None = None,
        *,
        raw: bool = False,
    ) -> float:
        """Expected seconds a new class-``cls`` request would wait (``raw``: without the
        correction learned from earlier estimates, where there is one)."""
        ...

    def estimate_range(
        self, cls: int, model: str | None, now: float, est_service_s: float | None = None
    ) -> tuple[float, WaitRange]:
        """:meth:`estimate_wait` with its interval (10th to 90th percentile) and what it rests on."""
        ...

    def quota_refusal(self, tenant: str | None, cls: int, now: float) -> tuple[str, str, float] | None:
        """``(reason, message, retry_after_s)`` if the tenant's entitlements or quotas
        would refuse a new class-``cls`` request now (``None``: not, or not known here)."""
        ...

    def snapshot(self) -> Snapshot: ...

    @property
    def queued(self) -> int: ...
