"""What an upstream worker asks its engine besides generations: whether it is up and serves
the model (``/models``, with the context it takes), its ``/metrics`` (whose, and the KV
space they say), its load, and the text of tokens it held back (``/detokenize``).

Each question is a GET or a small POST within :data:`PROBE_TIMEOUT_S`; nothing here runs
a generation on the engine.
"""

from __future__ import annotations

import asyncio
import json

from laneway.backends.base import EngineState, Health
from laneway.backends.capabilities import Capabilities, metrics_of, state_of
from laneway.backends.http import HttpError, Pool, Stale, Timeout

PROBE_TIMEOUT_S = 2.0


class Probe:
    """An upstream engine's health, context and load, as ``pool``'s engine says."""

    def __init__(self, pool: Pool, base: str, model: str, caps: Capabilities) -> None:
        self.pool = pool
        self.base = base
        self.model = model
        self.caps = caps
        self.context: int | None = None  # as the upstream's /models says (vLLM's max_model_len)
        self._asking: asyncio.Task[None] | None = None
        # vLLM serves /detokenize beside /v1, at the root
        self._detokenize = pool.target.path.removesuffix("/v1") + "/detokenize"

    async def health(self, busy: str) -> Health:
        """The upstream answers ``/models`` and serves the model (``busy``: the worker's
        slots, said where it is up)."""
        try:
            try:
                got = await self.pool.fetch("GET", "models", timeout_s=PROBE_TIMEOUT_S, max_bytes=4 << 20)
            except Stale:  # (a GET: asked again, on a new connection)
                got = await self.pool.fetch("GET", "models", timeout_s=PROBE_TIMEOUT_S, max_bytes=4 << 20)
        except HttpError as exc:
            # (slow, or a kept-alive connection closed as the probe went: not gone)
            transient = isinstance(exc, (Timeout, Stale))
            if not transient:  # unreachable: what comes back may be another engine
                self.caps.forget()
            return Health(False, f"{self.base}: {exc}", transient=transient)
        if got.status != 200:
            return Health(False, f"{self.base}/models answered {got.status}")
        try:
            listed = [m for m in json.loads(got.body).get("data", ()) if isinstance(m, dict)]
            served = [m.get("id") for m in listed]
        except (ValueError, AttributeError, TypeError):
            return Health(False, f"{self.base}/models did not answer a model list")
        for m in listed:  # vLLM and SGLang say how long a context the model takes
            n = m.get("max_model_len")
            if m.get("id") == self.model and isinstance(n, int) and not isinstance(n, bool) and n > 0:
                self.context = n
        if self.model not in served:
            names = ", ".join(str(s) for s in served) or "none"
            return Health(False, f"{self.base} does not serve model {self.model!r} (it serves: {names})")
        if self.caps.metrics is None and (self._asking is None or self._asking.done()):
            self._asking = asyncio.get_running_loop().create_task(self._ask_metrics())
        return Health(True, f"{self.base}: {busy}")

    async def _ask_metrics(self) -> None:
        self.caps.metrics, self.caps.kv_tokens = await metrics_of(self.pool)

    async def state(self) -> EngineState | None:
        """The engine's running and waiting requests and KV use, by its own ``/metrics``."""
        if self.caps.metrics is None:
            await self._ask_metrics()
        return await state_of(self.pool, self.model, self.caps.metrics or "")

    async def held_text(self, prompt_ids: list[int], out_ids: list[int], text: str) -> str | None:
        """Text of tokens the upstream had sent the ids of (``out_ids``) but not yet the text
        (it had sent ``text``) when a run was stopped (vLLM holds the last characters back
        while they could still be part of a stop string), read with its ``/detokenize``.
        ``None`` when it cannot be told: no such endpoint, or special tokens in the output
        (``ignore_eos``), which ``/detokenize`` writes out and the stream does not."""
        try:
            texts = []
            for ids in (prompt_ids + out_ids, prompt_ids):
                raw = json.dumps({"model": self.model, "tokens": ids}).encode()
                got = await self.pool.fetch("POST", self._detokenize, raw, timeout_s=PROBE_TIMEOUT_S)
                if got.status != 200:
                    return None
                texts.append(json.loads(got.body)["prompt"])
        except (HttpError, ValueError, KeyError, TypeError):
            return None
        full, head = texts
        if not isinstance(full, str) or not isinstance(head, str) or not full.startswith(head):
            return None
        made = full[len(head) :]
        return made[len(text) :] if made.startswith(text) else None

    def close(self) -> None:
        if self._asking is not None:
            self._asking.cancel()
