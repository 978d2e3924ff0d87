"""A gateway-only install: ``pip install laneway`` without the ``engine`` extra has no torch
and no transformers, serves an upstream engine, and says what to install when asked for
the built-in engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from laneway.testing import serve_process, standin_process

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gateway_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    venv = tmp_path_factory.mktemp("gateway") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    got = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    return python


def test_a_gateway_install_has_no_torch_and_serves_an_upstream(gateway_python: str, tmp_path: Path) -> None:
    missing = subprocess.run(
        [
            gateway_python,
            "-c",
            "import importlib.util as u; print([m for m in ('torch', 'transformers') if u.find_spec(m)])",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.stdout.strip() == "[]", missing
    with standin_process(tmp_path / "engine.log", "--model", "m", python=gateway_python) as engine:
        cfg = tmp_path / "laneway.toml"
        cfg.write_text(
            f'[server]\ndata_dir = "{tmp_path / "data"}"\n\n'
            f'[[workers]]\nname = "up"\ntype = "upstream"\nurl = "{engine.url}"\nmodel = "m"\nslots = 2\n',
            encoding="utf-8",
        )
        with serve_process("--config", str(cfg), log=tmp_path / "serve.log", python=gateway_python) as server:
            got = httpx.post(
                server.url + "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                timeout=30,
            )
            assert got.status_code == 200, got.text
            assert got.json()["choices"][0]["message"]["content"]
            assert got.json()["laneway"]["worker"] == "up"


def test_the_built_in_engine_without_its_extra_is_a_one_line_error(
    gateway_python: str, tmp_path: Path
) -> None:
    got = subprocess.run(
        [gateway_python, "-m", "laneway.cli", "serve", "--port", "0", "--data-dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode != 0
    assert "Traceback" not in got.stderr, got.stderr
    assert (
        "the built-in engine needs torch, which is not installed: pip install 'laneway[engine]'" in got.stderr
    )
