"""A real vLLM for the integration tests (``--vllm VENV --vllm-model DIR``), and laneway in front.

One vLLM serves every test, with ``--stream-interval 5``: its chunks carry
several tokens each (or none), as a loaded vLLM's do. A tool-call parser is
set so that it takes ``tool_choice``; ``--scheduling-policy priority`` so that it
takes each request's class (requests that give none are all priority 0: first
come, first served, as by default).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from laneway.testing import VllmProcess, vllm_process
from live_server import LiveServer, live_server
from vllm_helpers import upstream_config


@pytest.fixture(scope="session")
def vllm_paths(pytestconfig: pytest.Config) -> tuple[Path, Path]:
    here = pytestconfig.invocation_params.dir  # (tests run in folders of their own)
    venv = here / pytestconfig.getoption("--vllm")
    model = pytestconfig.getoption("--vllm-model")
    if model is None:
        raise pytest.UsageError("--vllm needs --vllm-model DIR (scripts/vllm-cpu model VENV DIR)")
    model = here / model
    for path in (venv / "bin" / "vllm", Path(model) / "config.json"):
        if not path.exists():
            raise pytest.UsageError(f"{path} is missing: run scripts/vllm-cpu install and model first")
    return venv, Path(model)


@pytest.fixture(scope="session")
def vllm(vllm_paths: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmProcess]:
    venv, model = vllm_paths
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    args = (
        "--stream-interval",
        "5",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "pythonic",
        "--scheduling-policy",
        "priority",
    )
    with vllm_process(venv, model, log, *args) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(vllm: VllmProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """laneway with one upstream worker (1 slot) in front of the vLLM."""
    with live_server(upstream_config(tmp_path_factory.mktemp("gw"), vllm.url, slots=1)) as server:
        yield server
