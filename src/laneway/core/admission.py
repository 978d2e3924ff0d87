"""Admission control: entitlements, per-tenant quotas and concurrency caps.

Pure bookkeeping; the scheduler calls :meth:`Admission.check` at submission
and keeps the per-tenant counters current on every transition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from laneway.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Quota:
    """A token bucket: ``rate_per_s`` refill, at most ``burst`` requests at once."""

    rate_per_s: float
    burst: float = 1.0

    def __post_init__(self) -> None:
        if self.rate_per_s <= 0 or self.burst < 1:
            raise ConfigError("quota: rate_per_s must be > 0 and burst >= 1")


@dataclass(frozen=True, slots=True)
class TokenQuota:
    """Tokens a minute (prompt and output, as they are made), at most ``burst`` ahead
    (default: a minute's worth). A tenant over it is refused until its bucket refills."""

    tokens_per_min: float
    burst: float | None = None

    def __post_init__(self) -> None:
        if self.tokens_per_min <= 0 or (self.burst is not None and self.burst <= 0):
            raise ConfigError("token quota: tokens_per_min and burst must be > 0")


class TokenBudget:
    """A bucket of tokens that may go into debt: a request is charged its prompt and its
    size (``max_tokens``) on admission, output past its size as it streams, and given
    back what it did not make when it ends; while the bucket is empty, or in debt, new
    requests of the tenant wait for it to refill. (Charging the size up front is what
    keeps a tenant from starting many long requests on one positive balance.)"""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, quota: TokenQuota, now: float) -> None:
        self.rate = quota.tokens_per_min / 60.0
        self.burst = quota.burst if quota.burst is not None else quota.tokens_per_min
        self.tokens = self.burst
        self.stamp = now

    def wait(self, now: float) -> float:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
        return 0.0 if self.tokens > 0 else (1.0 - self.tokens) / self.rate

    def take(self, n: float, now: float) -> None:
        """Take ``n`` tokens (``n < 0``: give them back, up to the burst)."""
        self.wait(now)
        self.tokens = min(self.burst, self.tokens - n)


@dataclass(frozen=True)
class TenantPolicy:
    """What one tenant may do. ``allowed=None`` allows every class."""

    allowed: frozenset[int] | None = None
    default_class: int | None = None
    quotas: Mapping[int, Quota] = field(default_factory=dict)  # class rank -> bucket
    max_concurrent: int | None = None  # admitted and not yet ended (queued + running)
    max_queued: int | None = None
    weight: float = 1.0  # its share inside a class, against other tenants (token-fair)
    token_quotas: Mapping[int, TokenQuota] = field(default_factory=dict)  # class rank -> tokens/min

    def fallback(self, default: int) -> int | None:
        """The class its work that names none gets where the server's ``default`` is: that
        class where allowed, else its most urgent allowed class below it (``None``: none is)."""
        if self.allowed is None or default in self.allowed:
            return default
        return min((c for c in self.allowed if c > default), default=None)


class TokenBucket:
    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, quota: Quota, now: float) -> None:
        self.rate = quota.rate_per_s
        self.burst = quota.burst
        self.tokens = quota.burst
        self.stamp = now

    def wait(self, now: float) -> float:
        """Seconds until a token is there (0: one is there now); takes nothing."""
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
        if self.tokens >= 1.0:
            return 0.0
        return (1.0 - self.tokens) / self.rate

    def take(self, now: float) -> float:
        """Take one token; return 0 on success, else seconds until one is there."""
        wait = self.wait(now)
        if wait == 0.0:
            self.tokens -= 1.0
        return wait


@dataclass(slots=True)
class TenantCounts:
    inflight: int = 0
    queued: int = 0


class Admission:
    """Per-tenant admission state."""

    def __init__(
        self,
        tenants: Mapping[str, TenantPolicy],
        default: TenantPolicy | None,
        class_names: tuple[str, ...],
    ) -> None:
        self.tenants = dict(tenants)
        self.default = default
        self.names = class_names
        self.counts: dict[str, TenantCounts] = {}
        self._buckets: dict[tuple[str, int], TokenBucket] = {}
        self._budgets: dict[tuple[str, int], TokenBudget] = {}

    def policy_for(self, tenant: str | None) -> TenantPolicy | None:
        if tenant is None:
            return None
        return self.tenants.get(tenant, self.default)

    def check(self, tenant: str | None, cls: int, now: float) -> tuple[str, str, float] | None:
        """``None`` when admissible, else ``(reason, message, retry_after_s)``.

        It charges nothing: call :meth:`charge` once the request is admitted.
        """
        pol = self.policy_for(tenant)
        if pol is None:
            return None
        name = self.names[cls]
        if pol.allowed is not None and cls not in pol.allowed:
            return ("not_entitled", f"tenant {tenant!r} may not use class {name}", 0.0)
        counts = self.counts.get(tenant)  # type: ignore[arg-type]
        if counts is not None:
            if pol.max_concurrent is not None and counts.inflight >= pol.max_concurrent:
                return (
                    "concurrency",
                    f"tenant {tenant!r} has {counts.inflight} requests in flight "
                    f"(limit {pol.max_concurrent})",
                    1.0,
                )
            if pol.max_queued is not None and counts.queued >= pol.max_queued:
                return (
                    "concurrency",
                    f"tenant {tenant!r} has {counts.queued} requests queued (limit {pol.max_queued})",
                    1.0,
                )
        quota = pol.quotas.get(cls)
        if quota is not None:
            wait = self._bucket(tenant, cls, quota, now).wait(now)  # type: ignore[arg-type]
            if wait > 0:
                return (
                    "rate_limited",
                    f"tenant {tenant!r} is over its {name} quota of {quota.rate_per_s:g}/s",
                    wait,
                )
        tq = pol.token_quotas.get(cls)
        if tq is not None:
            wait = self._budget(tenant, cls, tq, now).wait(now)  # type: ignore[arg-type]
            if wait > 0:
                return (
                    "rate_limited",
                    f"tenant {tenant!r} is over its {name} quota of {tq.tokens_per_min:g} tokens/min",
                    wait,
                )
        return None

    def charge_tokens(self, tenant: str | None, cls: int, tokens: float, now: float) -> None:
        """``tokens`` more of the tenant's class-``cls`` work (a prompt admitted, output made;
        fewer than 0: given back, output charged that was never made)."""
        if tenant is None or not tokens:
            return
        pol = self.policy_for(tenant)
        tq = pol.token_quotas.get(cls) if pol is not None else None
        if tq is not None:
            self._budget(tenant, cls, tq, now).take(tokens, now)

    def _budget(self, tenant: str, cls: int, quota: TokenQuota, now: float) -> TokenBudget:
        key = (tenant, cls)
        budget = self._budgets.get(key)
        if budget is None:
            budget = self._budgets[key] = TokenBudget(quota, now)
        return budget

    def charge(self, tenant: str, cls: int, now: float) -> None:
        """Take the quota token of an admitted request (``check`` only looks)."""
        pol = self.policy_for(tenant)
        quota = pol.quotas.get(cls) if pol is not None else None
        if quota is not None:
            self._bucket(tenant, cls, quota, now).take(now)

    def _bucket(self, tenant: str, cls: int, quota: Quota, now: float) -> TokenBucket:
        key = (tenant, cls)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(quota, now)
        return bucket

    def on_admit(self, tenant: str | None) -> None:
        if tenant is None:
            return
        c = self.counts.get(tenant)
        if c is None:
            c = self.counts[tenant] = TenantCounts()
        c.inflight += 1
        c.queued += 1

    def on_dequeue(self, tenant: str | None) -> None:
        if tenant is not None:
            self.counts[tenant].queued -= 1

    def on_requeue(self, tenant: str | None) -> None:
        if tenant is not None:
            self.counts[tenant].queued += 1

    def on_end(self, tenant: str | None) -> None:
        if tenant is not None:
            self.counts[tenant].inflight -= 1
