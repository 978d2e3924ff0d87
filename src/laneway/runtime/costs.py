"""The scheduler's cost model, measured on the in-process engines it drives.

The core's default :class:`~laneway.core.CostModel` describes a 7B model on a
datacentre GPU: a preemption is assumed to cost a ~33 ms decode step plus
copying 512 KiB of KV cache per token over PCIe. On another engine those
figures are wrong, and the scheduler's choice between preempting a batch job
and waiting for it to end ("drain") goes wrong with them: on the built-in
CPU models, where a preemption costs one ~5 ms step, it waited ~0.1 s for
victims it believed were about to end.

So when the configuration leaves ``[scheduler.costs]`` at its defaults and
every worker is an in-process engine, the runtime measures the engines once
at start-up (a short greedy job: prefill and decode speed) and reads the KV
cache size per token off the model's shape. A ``[scheduler.costs]`` table
that changes any figure turns this off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from laneway.backends.base import Worker, stream
from laneway.core import CostModel
from laneway.generation import Delta, Done, Job, SamplingParams

log = logging.getLogger("laneway.runtime")

PROMPT = "laneway measures how fast this engine reads a prompt and writes text. " * 2
TOKENS = 16  # decode steps measured
CPU_COPY_BYTES_S = 4e9  # a checkpoint on a CPU engine is a copy in host memory
TIMEOUT_S = 60.0


def kv_bytes_per_token(model: Any) -> int | None:
    """K and V of every layer for one token, from a transformers model config."""
    cfg = model.config
    try:
        heads = int(cfg.num_attention_heads)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        element = next(model.model.parameters()).element_size()
        return 2 * int(cfg.num_hidden_layers) * kv_heads * head_dim * element
    except (AttributeError, StopIteration, TypeError, ValueError, ZeroDivisionError):
        return None


async def _timed_job(worker: Worker, model_name: str) -> tuple[float, float, int]:
    """``(prefill_s, step_s, prompt_tokens)`` of one greedy job."""
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)
    job = Job("laneway-calibration", model_name, params, prompt=PROMPT)
    loop = asyncio.get_running_loop()
    start = loop.time()
    first = last = None
    prompt_tokens = 0
    async for event in stream(worker, job):
        if type(event) is Delta:
            last = loop.time()
            if first is None:
                first = last
        elif type(event) is Done:
            prompt_tokens = event.usage.prompt_tokens
    if first is None or last is None:
        raise RuntimeError("the calibration job wrote nothing")
    return first - start, (last - first) / max(TOKENS - 1, 1), prompt_tokens


async def engine_costs(worker: Worker, base: CostModel) -> CostModel | None:
    """The cost model of an in-process engine worker; ``None`` for any other worker."""
    loaded = getattr(worker.engine, "model", None)
    name = getattr(loaded, "name", None)
    if loaded is None or not isinstance(name, str):
        return None
    kv = kv_bytes_per_token(loaded.model)
    if kv is None:
        return None
    await _timed_job(worker, name)  # warm-up: first calls allocate and pick kernels
    prefill_s, step_s, prompt_tokens = await _timed_job(worker, name)
    on_cpu = getattr(getattr(loaded, "device", None), "type", "cpu") == "cpu"
    return replace(
        base,
        kv_bytes_per_token=kv,
        host_link_bytes_s=CPU_COPY_BYTES_S if on_cpu else base.host_link_bytes_s,
        prefill_tokens_s=max(prompt_tokens, 1) / max(prefill_s, 1e-6),
        decode_tokens_s=1.0 / max(step_s, 1e-6),
        step_s=step_s,
    )


async def measured_costs(workers: Mapping[str, Worker], base: CostModel) -> CostModel | None:
    """One cost model for every worker (the most expensive figures of each), or
    ``None`` when some worker is not an in-process engine or cannot be measured."""
    models = []
    for worker in workers.values():
        try:
            costs = await asyncio.wait_for(engine_costs(worker, base), TIMEOUT_S)
        except Exception as exc:  # the engine answers requests anyway: keep the defaults
            log.warning("could not measure the costs of worker %s: %s", worker.name, exc)
            return None
        if costs is None:
            return None
        models.append(costs)
    if not models:
        return None
    return replace(
        base,
        kv_bytes_per_token=max(c.kv_bytes_per_token for c in models),
        host_link_bytes_s=min(c.host_link_bytes_s for c in models),
        prefill_tokens_s=min(c.prefill_tokens_s for c in models),
        decode_tokens_s=min(c.decode_tokens_s for c in models),
        step_s=max(c.step_s for c in models),
    )
