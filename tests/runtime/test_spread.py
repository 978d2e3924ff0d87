"""Two upstream engines of several slots each: the server spreads requests over them (their
apps in this process, reached through in-memory transports: laneway.backends.inprocess)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from laneway.backends.factory import build_upstream
from laneway.backends.inprocess import InProcess
from laneway.config import load_config
from laneway.fault_harness import upstream_toml
from laneway.standin import StandIn
from live_server import live_server


def config_file(tmp_path: Path, placement: str | None) -> Path:
    path = tmp_path / "laneway.toml"
    toml = f'[server]\ndata_dir = "{tmp_path / "data"}"\n'
    if placement is not None:
        toml += f'\n[scheduler]\nplacement = "{placement}"\n'
    toml += upstream_toml("up0", "http://up0.invalid/v1", 4) + upstream_toml(
        "up1", "http://up1.invalid/v1", 4
    )
    path.write_text(toml)
    return path


async def send(url: str, n: int, tokens: int) -> list[int]:
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int) -> int:
            body = {"model": "m", "prompt": f"job {i}", "max_tokens": tokens, "priority": "P2"}
            r = await client.post(url + "/completions", json=body)
            return r.status_code

        return await asyncio.gather(*(one(i) for i in range(n)))


@pytest.mark.parametrize("placement", [None, "round-robin"], ids=["default", "round-robin"])
def test_four_requests_on_two_engines_of_four_slots_run_two_and_two(
    tmp_path: Path, placement: str | None
) -> None:
    """Found failing: the worker idle longest took every request while it had a free slot, so
    one engine ran four and the other none (with real vLLMs: 2x the time to first token)."""
    config = load_config(config_file(tmp_path, placement))
    assert config.scheduler.placement == (placement or "least-loaded")
    engines = {"up0": StandIn(slots=4, ms_per_token=10), "up1": StandIn(slots=4, ms_per_token=10)}
    workers = {w.name: build_upstream(w, connect=InProcess(engines[w.name])) for w in config.workers}
    with live_server(config, workers) as server:
        statuses = asyncio.run(send(server.base_url, 4, 40))
    assert statuses == [200] * 4
    assert [e.served for e in engines.values()] == [2, 2]
    assert [e.peak_requests for e in engines.values()] == [2, 2]
