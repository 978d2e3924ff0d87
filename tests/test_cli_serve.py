"""``laneway serve``: it starts, serves and stops; mistakes are one clean line, exit 2."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from laneway.cli import main

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
    proc = subprocess.Popen(
        [sys.executable, "-m", "laneway.cli", "serve", "--config", str(cfg), "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        m = re.search(r"on (http://127\.0\.0\.1:\d+) \(1 worker, 2 slots\); no API keys configured", first)
        assert m, first
        url = m.group(1)
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(url + "/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        r = httpx.post(url + "/v1/completions", json={"model": "sim", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["laneway"]["worker"] == "sim0"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
            if proc.stderr is not None:
                proc.stderr.close()
