"""``[tenants.NAME]``: a tenant's API keys (their SHA-256 digests), the classes it may use,
its default class, quotas and limits → :class:`~laneway.config.schema.TenantConfig`."""

from __future__ import annotations

from dataclasses import replace

from laneway.config.fields import REQUIRED, Table, parse_rank, rank
from laneway.config.schema import TenantConfig
from laneway.core import ConfigError, Quota, TenantPolicy
from laneway.core.admission import TokenQuota

_HEX = frozenset("0123456789abcdef")
QUOTA_KEYS = ("rate_per_s", "burst", "tokens_per_min", "tokens_burst")


def parse_tenants(table: Table, names: tuple[str, ...], default_class: int) -> tuple[TenantConfig, ...]:
    out = []
    owner: dict[str, str] = {}  # key digest -> the tenant it is of
    for name in list(table.data):
        if not name.isprintable():
            raise ConfigError(f"tenants: expected tenant names without control characters, got {name!r}")
        t = table.table(name)
        hashes = t.list("key_sha256", [])
        for h in hashes:
            if not isinstance(h, str) or len(h) != 64 or not set(h.lower()) <= _HEX:
                raise ConfigError(f"{t.key('key_sha256')}: expected SHA-256 hex digests (64 characters)")
            if owner.setdefault(h.lower(), name) != name:  # (one key is one tenant's)
                raise ConfigError(
                    f"{t.key('key_sha256')}: {h[:12]}… is a key of tenant {owner[h.lower()]!r} already"
                )
        allowed = t.list("allowed", None)
        try:
            allowed_ranks = None if allowed is None else frozenset(parse_rank(v, names) for v in allowed)
        except ValueError as exc:
            raise ConfigError(f"{t.key('allowed')}: {exc}") from None
        quotas_t = t.table("quotas")
        quotas = {}
        token_quotas = {}
        for cname in list(quotas_t.data):
            q = quotas_t.table(cname)
            try:
                cls = parse_rank(cname, names)
            except ValueError as exc:
                raise ConfigError(f"{q.path}: {exc}") from None
            for key in q.data:  # (a typo beside a rate is unknown, not a rate missing)
                if key not in QUOTA_KEYS:
                    raise ConfigError(f"{q.key(key)}: unknown key (one of: {', '.join(QUOTA_KEYS)})")
            tpm = q.float("tokens_per_min", None, positive=True)
            if tpm is not None:
                token_quotas[cls] = TokenQuota(tpm, q.float("tokens_burst", None, positive=True))
            rate = q.float("rate_per_s", None if tpm is not None else REQUIRED, positive=True)
            if rate is not None:
                quotas[cls] = Quota(rate, q.float("burst", 1.0, positive=True))
            q.done()
        policy = TenantPolicy(
            allowed=allowed_ranks,
            default_class=rank(t, "default_priority", names, None),
            quotas=quotas,
            max_concurrent=t.int("max_concurrent", None, low=1),
            max_queued=t.int("max_queued", None, low=1),
            weight=t.float("weight", 1.0, positive=True),
            token_quotas=token_quotas,
        )
        if (
            policy.default_class is not None
            and allowed_ranks is not None
            and policy.default_class not in allowed_ranks
        ):
            raise ConfigError(f"{t.key('default_priority')}: not among the tenant's allowed classes")
        if policy.default_class is None and allowed_ranks and default_class not in allowed_ranks:
            # (an empty list: a key for /metrics and the dashboard alone, which sends no request)
            # its requests that name no class get its most urgent allowed class below the
            # server's default (as its batches do); none below: it must say which
            fallback = policy.fallback(default_class)
            if fallback is None:
                raise ConfigError(
                    f"{t.key('allowed')}: leaves out {names[default_class]}, the class requests that "
                    "name none get (server.default_priority), and every class below it; give the "
                    "tenant a default_priority"
                )
            policy = replace(policy, default_class=fallback)
        t.done()
        out.append(TenantConfig(name, frozenset(h.lower() for h in hashes), policy))
    return tuple(out)
