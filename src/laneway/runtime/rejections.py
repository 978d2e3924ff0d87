"""The scheduler's refusals as client errors (DESIGN §3 statuses)."""

from __future__ import annotations

from laneway.core import Reject
from laneway.errors import ClassNotAllowed, ModelNotFound, QuotaExceeded, RequestError, Unavailable

QUOTA = frozenset({"rate_limited", "concurrency"})  # 429
UNAVAILABLE = frozenset(
    {"queue_timeout", "queue_full", "shed", "overloaded", "unavailable", "model_unavailable"}
)  # 503


def error_for(reject: Reject) -> RequestError:
    """403 not entitled, 404 unplaceable, 429 quota, 503 otherwise (with ``Retry-After``)."""
    reason = reject.reason
    if reason == "not_entitled":
        return ClassNotAllowed(reject.message, param="priority")
    if reason == "unplaceable":
        return ModelNotFound(reject.message, param="model")
    retry, wait = reject.retry_after_s, reject.estimated_wait_s
    if reason in QUOTA:
        return QuotaExceeded(reject.message, code=reason, retry_after_s=retry, estimated_wait_s=wait)
    return Unavailable(reject.message, code=reason, retry_after_s=retry, estimated_wait_s=wait)


def shutting_down() -> Unavailable:
    """503 ``shutting_down``: the server stops (a restart, or another replica, may answer)."""
    return Unavailable("the server is shutting down", code="shutting_down", retry_after_s=5.0)


def taken_for_dead() -> Unavailable:
    """503: this replica of a cluster stopped saying it lives for too long (a pause), so
    the leader gave its requests' slots away; the request may be sent again."""
    return Unavailable(
        "this replica was taken for dead by the cluster (it stopped answering for seconds) and "
        "its requests in flight were ended; send it again",
        code="unavailable",
        retry_after_s=1.0,
    )


def held_too_much(held: int, limit: int, size: int, wait: float) -> Unavailable:
    """503 ``overloaded``: the clients' requests the server holds (``held`` bytes) and this
    one (``size``) would pass ``max_queued_bytes`` (``limit``)."""
    return Unavailable(
        f"the server holds {_mib(held)} of requests (limit {_mib(limit)}); this one is {_mib(size)}",
        code="overloaded",
        estimated_wait_s=wait,
    )


def _mib(n: int) -> str:
    """A size for a person: ``0.6 MiB``, ``1 MiB``, ``12 MiB``."""
    mib = n / (1 << 20)
    return f"{mib:.1f} MiB" if mib < 10 and mib != int(mib) else f"{mib:.0f} MiB"
