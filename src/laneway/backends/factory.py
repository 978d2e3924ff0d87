"""Building the configured workers (``[[workers]]``: local, simulated, upstream)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from laneway.backends.base import Worker
from laneway.backends.simulated import SimulatedWorker
from laneway.config.schema import WorkerConfig
from laneway.core import ConfigError
from laneway.errors import DeviceUnavailable, ModelLoadError, ModelNotFound

if TYPE_CHECKING:
    from laneway.backends.http import Connect


ENGINE_MODULES = ("torch", "transformers", "safetensors", "tokenizers", "huggingface_hub")


async def build_worker(cfg: WorkerConfig, data_dir: Path) -> Worker:
    if cfg.type == "simulated":
        return SimulatedWorker(
            cfg.name,
            cfg.served_name,
            cfg.slots,
            tokens_per_s=cfg.tokens_per_s,
            first_token_s=cfg.first_token_s,
        )
    if cfg.type == "local":
        try:
            from laneway.backends.local import LocalWorker  # imports torch: only when asked
        except ModuleNotFoundError as exc:
            if exc.name not in ENGINE_MODULES:
                raise
            raise ConfigError(
                f"workers.{cfg.name}: the built-in engine needs {exc.name}, which is not installed: "
                "pip install 'laneway[engine]' (a gateway in front of upstream engines needs neither)"
            ) from None

        try:
            return await LocalWorker.create(
                cfg.name, cfg.model, cfg.slots, device=cfg.device, data_dir=data_dir / cfg.name
            )
        except (ModelNotFound, ModelLoadError) as exc:  # (the key of the configuration at fault)
            key = "device" if isinstance(exc, DeviceUnavailable) else "model"
            said = exc.message if isinstance(exc, ModelNotFound) else str(exc)
            raise ConfigError(f"workers.{cfg.name}.{key}: {said}") from None
    if cfg.type == "upstream":
        return build_upstream(cfg)
    raise ConfigError(f"workers.{cfg.name}.type: unknown worker type {cfg.type!r}")


def build_upstream(cfg: WorkerConfig, connect: Connect | None = None) -> Worker:
    """The hook for OpenAI-compatible upstreams (vLLM, SGLang, llama.cpp, TGI):
    ``laneway.backends.upstream.UpstreamWorker(name, url, model, slots=, api_key=,
    timeout_s=, stall_timeout_s=, token_ids=, options=, connect=, forward_priority=)``; ``connect``: how its
    HTTP client reaches the upstream (None: sockets; tests: :mod:`laneway.backends.inprocess`)."""
    try:
        module = importlib.import_module("laneway.backends.upstream")
    except ModuleNotFoundError as exc:
        if exc.name != "laneway.backends.upstream":
            raise
        raise ConfigError(
            f"workers.{cfg.name}.type: upstream workers are not available in this build"
        ) from None
    api_key = None
    if cfg.api_key_env is not None:
        api_key = os.environ.get(cfg.api_key_env)
        if api_key is None:
            raise ConfigError(
                f"workers.{cfg.name}.api_key_env: environment variable {cfg.api_key_env} is not set"
            )
    worker: Worker = module.UpstreamWorker(
        cfg.name,
        cfg.url,
        cfg.model,
        slots=cfg.slots,
        api_key=api_key,
        timeout_s=cfg.timeout_s,
        stall_timeout_s=cfg.stall_timeout_s if cfg.stall_timeout_s is not None else float("inf"),
        token_ids=cfg.token_ids,
        forward_priority=cfg.forward_priority,
        options=dict(cfg.options),
        connect=connect,
    )
    return worker


async def build_workers(configs: Sequence[WorkerConfig], data_dir: Path) -> dict[str, Worker]:
    """Every configured worker; on a failure the ones already built are closed."""
    built: dict[str, Worker] = {}
    try:
        for cfg in configs:
            built[cfg.name] = await build_worker(cfg, data_dir)
    except BaseException:
        for worker in built.values():
            await worker.close()
        raise
    return built
