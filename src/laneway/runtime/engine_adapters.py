"""LoRA adapters loaded into, and unloaded from, a running vLLM engine a fleet started.

vLLM serves ``POST /v1/load_lora_adapter`` (``{"lora_name", "lora_path"}``) and ``POST
/v1/unload_lora_adapter`` (``{"lora_name"}``) when started with ``--enable-lora`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; requests then name the adapter as their model.
An adapter it holds already counts as loaded, one it does not hold as unloaded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx

from laneway.errors import Unavailable

TIMEOUT_S = 120.0  # (an adapter's weights read from disk)
POLL_S = 0.05


class AdapterFailed(Exception):
    """The engine did not load the adapter; the message says why, in one line."""


async def load(engine_url: str, lora_name: str, lora_path: str) -> None:
    """Load ``lora_path`` as ``lora_name`` into the engine at ``engine_url`` (``…/v1``)."""
    body = {"lora_name": lora_name, "lora_path": lora_path}
    status, detail = await _post(engine_url + "/load_lora_adapter", body)
    if status == 200 or (status == 400 and "already been loaded" in detail):
        return
    hint = " (is its engine started with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True?)"
    missing = status in (404, 405) and "lora" not in detail.lower()  # (no such endpoint)
    raise AdapterFailed(f"loading it answered {status}: {detail}{hint if missing else ''}")


async def unload(engine_url: str, lora_name: str) -> None:
    """Unload ``lora_name`` from the engine at ``engine_url`` (one it does not hold: done)."""
    status, detail = await _post(engine_url + "/unload_lora_adapter", {"lora_name": lora_name})
    if status not in (200, 404):
        raise AdapterFailed(f"unloading it answered {status}: {detail}")


async def wait_listed(engine_url: str, lora_name: str, timeout_s: float = TIMEOUT_S) -> None:
    """Until the engine at ``engine_url`` lists ``lora_name`` among its models (another replica
    of a cluster loads it there); :class:`AdapterFailed` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
        while True:
            try:
                r = await client.get(engine_url + "/models")
                listed = {m.get("id") for m in r.json().get("data", ())} if r.status_code == 200 else set()
            except (httpx.HTTPError, ValueError, AttributeError):
                listed = set()
            if lora_name in listed:
                return
            if time.monotonic() >= deadline:
                raise AdapterFailed(f"it was not loaded into its engine within {timeout_s:g} s")
            await asyncio.sleep(POLL_S)


async def _post(url: str, body: dict[str, str]) -> tuple[int, str]:
    try:
        async with httpx.AsyncClient(timeout=TIMEOUT_S, trust_env=False) as client:
            r = await client.post(url, json=body)
    except httpx.HTTPError as exc:
        raise AdapterFailed(f"{type(exc).__name__}: {exc}".rstrip(": ")) from None
    if r.status_code == 200:
        return 200, ""
    try:
        message = r.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = r.text
    return r.status_code, " ".join(str(message).split())[:300]


def listed_gate(url: str, adapters: frozenset[str]) -> Callable[[str], Awaitable[None]]:
    """What a request for one of ``adapters`` awaits before it is sent to the engine at ``url``
    when another replica of a cluster started it (and loads the adapter there, as the leader
    decided): the engine lists it."""

    async def gate(model: str) -> None:
        if model in adapters:
            try:
                await wait_listed(url, model)
            except AdapterFailed as exc:
                raise Unavailable(
                    f"adapter {model!r}: {exc}", code="model_unavailable", retry_after_s=5.0
                ) from None

    return gate
