"""The scheduler's cost model, measured on in-process engines at start-up."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from laneway.backends.local import LocalWorker
from laneway.backends.simulated import SimulatedWorker
from laneway.config import ServerConfig, WorkerConfig
from laneway.core import CostModel, SchedulerConfig
from laneway.runtime import Runtime
from live_server import tiny

TIMEOUT_S = 60.0


def test_builtin_engine_costs_replace_the_7b_defaults(tmp_path: Path) -> None:
    async def main() -> None:
        worker = await LocalWorker.create("w0", "builtin:tiny", 2, data_dir=tmp_path)
        rt = Runtime(replace(ServerConfig(), workers=(tiny(),)), {"w0": worker})
        try:
            costs = await asyncio.wait_for(rt.calibrate(), TIMEOUT_S)
            assert costs is not None
            cfg = worker.engine.model.config
            head_dim = cfg.hidden_size // cfg.num_attention_heads
            # K and V, every layer, float32
            assert (
                costs.kv_bytes_per_token == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4
            )
            assert 0 < costs.step_s < 1.0 and costs.decode_tokens_s == 1.0 / costs.step_s
            assert costs.prefill_tokens_s > 0
            assert costs.default_prompt_tokens == CostModel().default_prompt_tokens
            assert rt.sched.cfg.costs == costs  # the scheduler decides with them
            assert worker.capacity().busy == 0  # the measuring jobs are gone
        finally:
            await rt.close()

    asyncio.run(main())


def test_configured_costs_or_other_workers_are_left_alone(tmp_path: Path) -> None:
    async def main() -> None:
        sim = SimulatedWorker("s0", "sim", 1)
        cfg = replace(ServerConfig(), workers=(WorkerConfig("s0", "simulated", "sim", "sim", 1),))
        rt = Runtime(cfg, {"s0": sim})
        try:
            assert await rt.calibrate() is None
            assert sim.started == 0
        finally:
            await rt.close()
        worker = await LocalWorker.create("w0", "builtin:tiny", 1, data_dir=tmp_path)
        mine = CostModel(step_s=0.5)
        cfg = replace(ServerConfig(), workers=(tiny(),), scheduler=SchedulerConfig(costs=mine))
        rt = Runtime(cfg, {"w0": worker})
        try:
            assert await rt.calibrate() is None
            assert rt.sched.cfg.costs == mine
        finally:
            await rt.close()

    asyncio.run(main())
