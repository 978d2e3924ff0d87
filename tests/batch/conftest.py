from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from laneway.config import BatchConfig
from live_server import LiveServer, live_server, sim_config


@pytest.fixture(scope="module")
def batch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """4 simulated slots at 500 tokens/s, its model also called ``sim-alias``; small limits to
    test them; a fast runner poll."""
    path: Path = tmp_path_factory.mktemp("batches")
    cfg = sim_config(path, slots=4, tokens_per_s=500.0)
    batches = BatchConfig(poll_s=0.1, max_file_bytes=256 << 10, max_lines=500)
    cfg = replace(cfg, batches=batches, aliases={"sim-alias": "sim"})
    with live_server(cfg) as server:
        yield server
