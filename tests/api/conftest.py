from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from live_server import LiveServer, live_server, sim_config


@pytest.fixture(scope="module")
def sim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server with one simulated worker (2 slots, 500 tokens/s), no keys."""
    path: Path = tmp_path_factory.mktemp("sim")
    with live_server(sim_config(path, slots=2, tokens_per_s=500.0)) as server:
        yield server
