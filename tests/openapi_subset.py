"""The part of OpenAI's OpenAPI description that laneway serves, as a small OpenAPI dict.

OpenAI's description (openai/openai-openapi, commit f85dbe223d40, MIT
licence: ``tests/data/openai-openapi-LICENSE``) is ~3 MB of YAML with ~180
paths. The subset is kept in the repository (``tests/data/
openai-openapi-subset.json``, made by :func:`load_subset` from it); given the
whole description (``$LANEWAY_OPENAI_SPEC``, or ``openai-openapi.yaml`` in a
``shared/openapi`` folder beside the repository) the tests take the subset from
it instead, and a test checks that the kept one is the same.
:func:`load_subset` keeps only the operations in :data:`SERVED`, under
laneway's ``/v1/...`` paths (OpenAI's paths are relative to the server
``https://api.openai.com/v1``), and the components they ``$ref``,
transitively. The result is cached in memory per file version and, given a
``cache_dir``, as JSON keyed by the SHA-256 of the YAML and :data:`SERVED` (a later run skips the
YAML parse). Every call returns a fresh copy, free to patch.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
SPEC_ENV = "LANEWAY_OPENAI_SPEC"
DEFAULT_SPEC = ROOT.parent / "shared" / "openapi" / "openai-openapi.yaml"
KEPT = ROOT / "tests" / "data" / "openai-openapi-subset.json"
PREFIX = "/v1"  # OpenAI's server is https://api.openai.com/v1; laneway serves the same paths under /v1
CACHE_VERSION = 1  # bump when the extraction changes (what it serves is in the key)

# OpenAI's path -> the methods laneway serves on it (src/laneway/api/app.py ROUTES)
SERVED: dict[str, tuple[str, ...]] = {
    "/chat/completions": ("post",),
    "/completions": ("post",),
    "/embeddings": ("post",),
    "/models": ("get",),
    "/models/{model}": ("get",),
    "/files": ("post", "get"),
    "/files/{file_id}": ("get", "delete"),
    "/files/{file_id}/content": ("get",),
    "/batches": ("post", "get"),
    "/batches/{batch_id}": ("get",),
    "/batches/{batch_id}/cancel": ("post",),
    "/responses": ("post",),
    "/responses/{response_id}": ("get", "delete"),
    "/responses/{response_id}/input_items": ("get",),
    "/responses/input_tokens": ("post",),
}
DROPPED_KEYS = frozenset({"x-oaiMeta"})  # documentation only (code samples), the bulk of an operation


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """Safe YAML, libyaml's parser where there is one; dates stay strings (as in JSON)."""


_Loader.yaml_implicit_resolvers = {
    first: [r for r in resolvers if r[0] != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def spec_path() -> Path | None:
    """The whole description, where there is one (``$LANEWAY_OPENAI_SPEC`` must exist)."""
    given = os.environ.get(SPEC_ENV)
    if given:
        return Path(given)
    return DEFAULT_SPEC if DEFAULT_SPEC.is_file() else None


def load_kept() -> dict[str, Any]:
    """The subset kept in the repository."""
    loaded: dict[str, Any] = json.loads(KEPT.read_text(encoding="utf-8"))
    return loaded


def load_subset(path: Path | None = None, cache_dir: Path | None = None) -> dict[str, Any]:
    """The subset of the spec at ``path`` (default: :func:`spec_path`, else the kept one)
    for :data:`SERVED`."""
    path = path or spec_path()
    if path is None:
        return load_kept()
    path = path.resolve()
    if not path.is_file():  # a failure, not a skip: the contract is not checked without it
        raise FileNotFoundError(f"OpenAI's OpenAPI description is not at {path} (set ${SPEC_ENV})")
    st = path.stat()
    return copy.deepcopy(
        _cached(str(path), st.st_mtime_ns, st.st_size, str(cache_dir) if cache_dir else None)
    )


@functools.cache
def _cached(path: str, mtime_ns: int, size: int, cache_dir: str | None) -> dict[str, Any]:
    del mtime_ns, size  # only the cache key: a changed file is read again
    data = Path(path).read_bytes()
    stored = None
    if cache_dir is not None:
        digest = hashlib.sha256(data + json.dumps(SERVED, sort_keys=True).encode()).hexdigest()[:24]
        stored = Path(cache_dir) / f"openai-subset-v{CACHE_VERSION}-{digest}.json"
        if stored.exists():
            subset: dict[str, Any] = json.loads(stored.read_text(encoding="utf-8"))
            return subset
    subset = extract(yaml.load(data, Loader=_Loader))  # a safe loader
    if stored is not None:
        stored.parent.mkdir(parents=True, exist_ok=True)
        tmp = stored.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(subset), encoding="utf-8")
        tmp.replace(stored)
    return subset


def extract(spec: dict[str, Any], served: dict[str, tuple[str, ...]] = SERVED) -> dict[str, Any]:
    """The operations in ``served`` (under :data:`PREFIX`) and everything they reference."""
    paths: dict[str, Any] = {}
    for path, methods in served.items():
        item = spec["paths"][path]
        kept = {k: _clean(v) for k, v in item.items() if k in methods or k in ("parameters", "servers")}
        missing = set(methods) - kept.keys()
        if missing:
            raise KeyError(f"{path}: the spec has no {', '.join(sorted(missing))}")
        paths[PREFIX + path] = kept
    components: dict[str, dict[str, Any]] = {}
    pending = list(refs(paths))
    seen: set[str] = set()
    while pending:
        ref = pending.pop()
        if ref in seen:
            continue
        seen.add(ref)
        section, name = component(ref)
        if name in components.get(section, {}):
            continue
        target = _clean(spec["components"][section][name])
        components.setdefault(section, {})[name] = target
        pending.extend(refs(target))
    return {
        "openapi": spec["openapi"],
        "info": {**spec["info"], "title": spec["info"]["title"] + " (the operations laneway serves)"},
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {s: dict(sorted(c.items())) for s, c in sorted(components.items())},
    }


def component(ref: str) -> tuple[str, str]:
    """``#/components/schemas/Name[/...]`` -> ("schemas", "Name"): a deeper pointer keeps the whole one."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in ref.split("/")]
    if len(parts) < 4 or parts[0] != "#" or parts[1] != "components":
        raise ValueError(f"a $ref outside #/components: {ref}")
    return parts[2], parts[3]


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            yield ref
        for value in node.values():
            yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def _clean(node: Any) -> Any:
    """A copy without :data:`DROPPED_KEYS`, with string keys only (JSON)."""
    if isinstance(node, dict):
        return {str(k): _clean(v) for k, v in node.items() if k not in DROPPED_KEYS}
    if isinstance(node, list):
        return [_clean(v) for v in node]
    return node


# fields of the spec's Response a Responses request may set, each said back as given
SAID_BACK: dict[str, object] = {
    "parallel_tool_calls": False,
    "tool_choice": "none",
    "safety_identifier": "user-1",
    "prompt_cache_key": "agent-7",
    "top_logprobs": 0,
    "background": False,
}
