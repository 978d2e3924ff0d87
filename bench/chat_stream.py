"""One streamed chat request, timed: its first text, its end, what its usage says. Shared
by the benchmarks that time urgent requests (upstream, sharing, replica, routing)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx


def has_text(line: str) -> bool:
    """Whether a line of a chat stream is a chunk with text in it (not a role alone)."""
    return line.startswith("data: {") and '"content":"' in line and '"content":""' not in line


async def streamed(
    client: httpx.AsyncClient, url: str, body: dict[str, Any]
) -> tuple[float, float, dict[str, Any] | None]:
    """(time to first text, whole latency, in seconds; the last usage object it sent) of
    one streamed chat request."""
    t0 = time.perf_counter()
    first = None
    usage: dict[str, Any] | None = None
    async with client.stream("POST", url + "/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if first is None and has_text(line):
                first = time.perf_counter() - t0
            if line.startswith("data: {") and '"usage":{' in line:
                usage = json.loads(line[6:]).get("usage") or usage
    total = time.perf_counter() - t0
    return (first if first is not None else total), total, usage


async def urgent(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> tuple[float, float]:
    """(time to first text, whole latency) of one streamed request, in seconds."""
    first, total, _ = await streamed(client, url, body)
    return first, total


async def turn(
    client: httpx.AsyncClient, url: str, body: dict[str, Any]
) -> tuple[float, float, float | None]:
    """One streamed chat: (time to its first text, to its end, the share of its prompt the
    engine had cached: its usage's ``prompt_tokens_details.cached_tokens``, ``None`` where
    it says none), in seconds."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    first, total, usage = await streamed(client, url, body)
    details = (usage or {}).get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    if not usage or not usage.get("prompt_tokens") or not isinstance(cached, int):
        return first, total, None
    return first, total, cached / usage["prompt_tokens"]
