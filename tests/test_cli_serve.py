"""``laneway serve``: it starts, serves and stops; mistakes are one clean line, exit 2."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from laneway.cli import main
from laneway.testing import serve_process

SIM_CONFIG = """
[server]
data_dir = "{data}"
[[workers]]
name = "sim0"
type = "simulated"
model = "sim"
slots = 2
tokens_per_s = 1000
"""


def error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("laneway: error: "), captured.err
    return lines[0]


def test_refuses_public_host_without_keys(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    line = error_line(capsys, ["serve", "--host", "0.0.0.0", "--data-dir", str(tmp_path)])
    assert "without API keys" in line and "--insecure" in line


def test_config_and_flag_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[workers]]\ntype = 'sim'\n", encoding="utf-8")
    assert "workers[0].type: unknown worker type" in error_line(capsys, ["serve", "--config", str(bad)])
    assert "no such file" in error_line(capsys, ["serve", "--config", str(tmp_path / "missing.toml")]).lower()
    assert "--slots" in error_line(capsys, ["serve", "--slots", "0"])
    assert "unknown model" in error_line(capsys, ["serve", "--model", str(tmp_path / "nope"), "--port", "0"])
    up = tmp_path / "up.toml"
    up.write_text(
        "[[workers]]\ntype = 'upstream'\nmodel = 'm'\nurl = 'http://127.0.0.1:9/v1'\n"
        "api_key_env = 'LANEWAY_TEST_UNSET_KEY'\n"
    )
    line = error_line(capsys, ["serve", "--config", str(up), "--port", "0"])
    assert "workers.w0" in line


def test_serve_starts_answers_and_stops(tmp_path: Path) -> None:
    cfg = tmp_path / "sim.toml"
    cfg.write_text(SIM_CONFIG.format(data=tmp_path / "data"), encoding="utf-8")
    with serve_process("--config", str(cfg), log=tmp_path / "serve.log") as server:
        assert re.search(r"\(1 worker, 2 slots\); no API keys configured", server.banner), server.banner
        r = httpx.post(server.url + "/v1/completions", json={"model": "sim", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["laneway"]["worker"] == "sim0"
    assert server.proc.returncode is not None  # stopped
