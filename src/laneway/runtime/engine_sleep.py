"""vLLM's sleep mode, spoken to an engine a fleet started: its weights leave the GPUs for
host memory and come back in seconds, where a cold start takes tens of seconds.

vLLM serves it with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``: ``POST
/sleep?level=1`` (weights to host memory, KV cache dropped), ``POST /wake_up``, ``GET
/is_sleeping`` (``{"is_sleeping": bool}``). Level 1 only: a woken engine serves the same
model again.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from laneway.runtime.launcher import EngineProcess

SLEEP_TIMEOUT_S = 120.0  # (a large model's weights copied to host memory)
POLL_S = 0.1


class SleepFailed(Exception):
    """The engine did not go to sleep, or did not wake: it is stopped instead."""


async def sleep(engine: EngineProcess) -> None:
    """Put ``engine`` to sleep; returns once it says it sleeps."""
    await _call(engine, "/sleep?level=1", want=True)


async def wake(engine: EngineProcess) -> None:
    """Wake ``engine``; returns once it says it is awake."""
    await _call(engine, "/wake_up", want=False)


async def _call(engine: EngineProcess, path: str, *, want: bool) -> None:
    root = engine.url.removesuffix("/v1")
    deadline = time.monotonic() + SLEEP_TIMEOUT_S
    async with httpx.AsyncClient(timeout=SLEEP_TIMEOUT_S, trust_env=False) as client:
        try:
            r = await client.post(root + path)
            if r.status_code != 200:
                raise SleepFailed(
                    f"POST {path} answered {r.status_code} (is it started with --enable-sleep-mode?)"
                )
            while time.monotonic() < deadline:
                state = await client.get(root + "/is_sleeping")
                if state.status_code == 200 and state.json().get("is_sleeping") is want:
                    return
                await asyncio.sleep(POLL_S)
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise SleepFailed(f"{path}: {exc or type(exc).__name__}") from None
    raise SleepFailed(
        f"{path}: it did not say it {'sleeps' if want else 'is awake'} in {SLEEP_TIMEOUT_S:g} s"
    )
