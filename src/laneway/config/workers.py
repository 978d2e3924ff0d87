"""The ``[[workers]]`` of the configuration file → :class:`~laneway.config.schema.WorkerConfig`."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from laneway.config.fields import Table
from laneway.config.schema import DEFAULT_MODEL, TOKEN_ID_DIALECTS, WORKER_TYPES, WorkerConfig
from laneway.config.urls import is_http
from laneway.core import ConfigError

MAX_SLOTS = 100_000  # a worker's requests at once (as the simulator's --slots): past it, a typo

# body fields laneway sets in each request to an upstream (or that break what it counts):
# an ``x_`` option may not set them for every request
MANAGED_FIELDS = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "n",
        "messages",
        "prompt",
        "input",
        "priority",
        "return_token_ids",
        "continue_final_message",
        "add_generation_prompt",
    }
)


def parse_workers(items: list[Any]) -> tuple[WorkerConfig, ...]:
    out: list[WorkerConfig] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        t = Table(item, f"workers[{i}]")
        name = t.label("name", f"w{i}")
        if name in seen:
            raise ConfigError(f"{t.key('name')}: duplicate worker name {name!r}")
        seen.add(name)
        if "kind" in t.data and "type" not in t.data:  # (as a fleet's or Kubernetes' word for it)
            raise ConfigError(f"{t.key('kind')}: unknown key (a worker's kind is its type: type = ...)")
        kind = t.str("type", "local")
        if kind not in WORKER_TYPES:
            raise ConfigError(
                f"{t.key('type')}: unknown worker type {kind!r}; choose from {', '.join(WORKER_TYPES)}"
            )
        _own_keys(t, kind)
        default_model = {"local": DEFAULT_MODEL, "simulated": "simulated"}.get(kind)
        model = t.label("model", default_model) if default_model else t.label("model")
        url = t.str("url", None)
        if kind == "upstream" and url is None:
            raise ConfigError(f"{t.key('url')}: required for an upstream worker")
        if url is not None:
            _check_url(t.key("url"), url)
        token_ids = t.str("token_ids", "vllm")
        if token_ids not in TOKEN_ID_DIALECTS:
            raise ConfigError(
                f"{t.key('token_ids')}: expected one of {', '.join(TOKEN_ID_DIALECTS)}, got {token_ids!r}"
            )
        served = t.label("served_name", _served_name(model, kind))
        slots = t.int("slots", 4, low=1, high=MAX_SLOTS)
        if t.int("min_slots", 1, low=1) > slots:
            raise ConfigError(f"{t.key('min_slots')}: must be at most slots ({slots})")
        if "min_slots" in t and t.bool("adapt_slots", True) is False:
            raise ConfigError(
                f"{t.key('min_slots')}: the floor of an adapted concurrency; with adapt_slots = false "
                "its slots are fixed (leave min_slots out)"
            )
        options = {}  # x_top_k = 5: "top_k": 5 in every body (the client's own top_k wins)
        for k in [k for k in t.data if k.startswith("x_")]:
            if len(k) == 2:
                raise ConfigError(f"{t.key(k)}: name the body field after x_ (x_top_k = 5 sends top_k)")
            if k[2:] in MANAGED_FIELDS:
                why = {
                    "x_priority": " (forward_priority = true sends each request's class)",
                    "x_n": " (the client's n: laneway counts each request's tokens by it)",
                }
                said = f"laneway sets {k[2:]} in each request it sends{why.get(k, '')}"
                raise ConfigError(f"{t.key(k)}: {said}")
            options[k[2:]] = t.raw(k)
        out.append(
            WorkerConfig(
                name=name,
                type=kind,
                model=model,
                served_name=served,
                slots=slots,
                device=t.str("device", None),
                tokens_per_s=t.float("tokens_per_s", 50.0, positive=True, optional=True),
                first_token_s=t.float("first_token_s", 0.0),
                url=url,
                api_key_env=t.str("api_key_env", None),
                timeout_s=t.float("timeout_s", 600.0, positive=True),
                stall_timeout_s=t.float("stall_timeout_s", 30.0, positive=True, optional=True),
                token_ids=token_ids,
                kv_tokens=t.int("kv_tokens", None, low=1),
                adapt_slots=t.bool("adapt_slots", True),
                min_slots=t.int("min_slots", 1, low=1),
                forward_priority=t.bool("forward_priority", False),
                isolate=t.bool("isolate", False),
                options=options,
            )
        )
        t.done()
    return tuple(out)


# the keys of one worker type only (the others' are refused, not ignored)
_UPSTREAM_KEYS = (
    "url", "api_key_env", "timeout_s", "stall_timeout_s", "adapt_slots", "forward_priority",
    "min_slots", "kv_tokens", "token_ids",
)  # fmt: skip
TYPE_KEYS = {
    "device": "local",
    "tokens_per_s": "simulated",
    "first_token_s": "simulated",
    **dict.fromkeys(_UPSTREAM_KEYS, "upstream"),
}


def _own_keys(t: Table, kind: str) -> None:
    """A key of another worker type is a mistake to name (an upstream's ``url`` on a worker
    whose ``type`` was left out, so ``local``), not one to ignore."""
    for key in t.data:
        of = "upstream" if key.startswith("x_") else TYPE_KEYS.get(key)
        if of is not None and of != kind:
            said = "" if "type" in t.data else ", the default"
            raise ConfigError(
                f"{t.key(key)}: a key of {of} workers, and this worker's type is {kind!r}{said} "
                f'(type = "{of}"?)'
            )


def _check_url(key: str, url: str) -> None:
    """An upstream's base URL: http(s), a host, a port that is one, no query, no user."""
    if not is_http(url) or urlsplit(url).query:
        try:
            _ = urlsplit(url).port  # (a number past 65535 raises)
        except ValueError:
            raise ConfigError(f"{key}: {url!r} has no valid host and port (a port is 1 to 65535)") from None
        raise ConfigError(
            f"{key}: expected an http:// or https:// URL such as http://127.0.0.1:8001/v1, got {url!r}"
        )
    if "@" in urlsplit(url).netloc:  # (it would show in /readyz, errors and logs)
        raise ConfigError(
            f"{key}: a user or password in the URL is not taken (it would be shown wherever the URL "
            "is: /readyz, errors, logs); give the engine's key by api_key_env"
        )


def _served_name(model: str, kind: str) -> str:
    """A local model directory is served under its directory name."""
    if kind == "local" and not model.startswith("builtin:"):
        return Path(model).name or model
    return model
