"""The stand-in engine's LoRA adapters: vLLM's runtime adapter loading, spoken as vLLM does.

With ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` in its environment
(as vLLM needs), the stand-in serves ``POST /v1/load_lora_adapter`` (``{"lora_name",
"lora_path"}``: the path must be a directory with an ``adapter_config.json``; loading
takes ``--lora-load-s``) and ``POST /v1/unload_lora_adapter`` (``{"lora_name"}``), with
vLLM's answers: 200 and a line of text, 400 for one loaded already, 404 for a path with
no adapter or a name not loaded. Requests then name an adapter as their model; it writes
other words than its base (the adapter's name seeds them). For tests it counts loads,
unloads and the most adapters it held at once (``/stats``).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any


def runtime_updating() -> bool:
    """Whether this process may load adapters at run time (vLLM's switch)."""
    return os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true")


class Adapters:
    def __init__(self, base: str, load_s: float = 0.0) -> None:
        self.base = base
        self.load_s = load_s
        self.paths: dict[str, str] = {}  # name -> path, as loaded
        self.loads = 0
        self.unloads = 0
        self.peak = 0  # most adapters held at once

    def serves(self, model: object) -> bool:
        return isinstance(model, str) and model in self.paths

    async def call(self, path: str, body: Any) -> tuple[int, str | dict[str, Any]]:
        """``POST path`` with ``body``: (status, a line of text or an error object)."""
        name = body.get("lora_name") if isinstance(body, dict) else None
        if path.endswith("/unload_lora_adapter"):
            if not name:
                return 400, _error(
                    "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput"
                )
            if name not in self.paths:
                return 404, _error(f"The lora adapter '{name}' cannot be found.", "NotFoundError")
            del self.paths[name]
            self.unloads += 1
            return 200, f"Success: LoRA adapter '{name}' removed successfully."
        where = body.get("lora_path") if isinstance(body, dict) else None
        if not name or not where:
            return 400, _error("Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        if name in self.paths or name == self.base:
            return 400, _error(f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput")
        if not (Path(str(where)) / "adapter_config.json").is_file():
            return 404, _error(f"Loading lora {name} failed: No adapter found for {where}", "NotFoundError")
        await asyncio.sleep(self.load_s)
        self.paths[name] = str(where)
        self.loads += 1
        self.peak = max(self.peak, len(self.paths))
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    def models(self) -> list[dict[str, Any]]:
        """Its adapters as ``/v1/models`` lists them (each with its base as parent)."""
        return [
            {"id": n, "object": "model", "owned_by": "standin", "root": p, "parent": self.base}
            for n, p in self.paths.items()
        ]

    def stats(self) -> dict[str, object]:
        return {
            "adapters": sorted(self.paths),
            "adapter_loads": self.loads,
            "adapter_unloads": self.unloads,
            "peak_adapters": self.peak,
        }


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None}}
