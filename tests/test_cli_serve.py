"""``laneway serve``: it starts, serves and stops; mistakes are one clean line, exit 2."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from laneway.cli import main
from laneway.testing import ServeProcess, serve_process

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


def test_a_public_host_with_keys_is_told_that_its_operations_pages_need_none() -> None:
    from laneway.config import hash_key, parse_config
    from laneway.serve import check_exposure

    def note(**server: object) -> str:
        tenants = {"t": {"key_sha256": [hash_key("k")]}}
        return check_exposure(parse_config({"server": server, "tenants": tenants}), insecure=False)

    said = note(host="0.0.0.0")
    assert said.startswith("API keys required (1 tenant); /metrics and the dashboard need none on 0.0.0.0")
    assert "ops_auth = true" in said
    assert "dashboard" not in note(host="0.0.0.0", dashboard=False)
    assert note(host="0.0.0.0", ops_auth=True) == note(host="127.0.0.1") == "API keys required (1 tenant)"


def test_config_and_flag_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[workers]]\ntype = 'sim'\n", encoding="utf-8")
    assert "workers[0].type: unknown worker type" in error_line(capsys, ["serve", "--config", str(bad)])
    assert "no such file" in error_line(capsys, ["serve", "--config", str(tmp_path / "missing.toml")]).lower()
    assert "--slots" in error_line(capsys, ["serve", "--slots", "0"])
    line = error_line(capsys, ["serve", "--otlp-traces-endpoint", "127.0.0.1:4318"])
    assert "--otlp-traces-endpoint: an OTLP/HTTP URL" in line
    assert "unknown model" in error_line(capsys, ["serve", "--model", str(tmp_path / "nope"), "--port", "0"])
    up = tmp_path / "up.toml"
    up.write_text(
        "[[workers]]\ntype = 'upstream'\nmodel = 'm'\nurl = 'http://127.0.0.1:9/v1'\n"
        "api_key_env = 'LANEWAY_TEST_UNSET_KEY'\n"
    )
    line = error_line(capsys, ["serve", "--config", str(up), "--port", "0"])
    assert f"{up}: workers.w0.api_key_env: environment variable LANEWAY_TEST_UNSET_KEY is not set" in line
    floor = tmp_path / "floor.toml"
    floor.write_text(
        "[[workers]]\ntype = 'upstream'\nmodel = 'm'\nurl = 'http://127.0.0.1:9/v1'\nmin_slots = 3\n"
    )
    line = error_line(capsys, ["serve", "--config", str(floor), "--slots", "2", "--port", "0"])
    assert (
        "argument --slots: 2 is under worker w0's min_slots (3)" in line
    )  # (it failed at its first saturation)
    local = tmp_path / "local.toml"
    local.write_text("[[workers]]\nmodel = 'builtin:tiny'\ndevice = 'tpu'\n")
    line = error_line(capsys, ["serve", "--config", str(local), "--port", "0"])
    assert f"{local}: workers.w0.device: unknown device 'tpu'" in line
    local.write_text("[[workers]]\nmodel = 'builtin:huge'\n")
    line = error_line(capsys, ["serve", "--config", str(local), "--port", "0"])
    assert f"{local}: workers.w0.model: unknown built-in model 'builtin:huge'" in line


def test_a_damaged_store_is_one_line_at_start(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "laneway.db").write_bytes(b"")  # e.g. a disk that filled up, a bad copy
    line = error_line(capsys, ["serve", "--data-dir", str(tmp_path), "--port", "0"])
    assert "laneway.db is empty" in line
    (tmp_path / "laneway.db").write_bytes(b"not a database" * 500)
    assert "laneway.db cannot be used" in error_line(capsys, ["serve", "--data-dir", str(tmp_path)])


def test_serve_starts_answers_and_stops(tmp_path: Path) -> None:
    cfg = tmp_path / "sim.toml"
    cfg.write_text(SIM_CONFIG.format(data=tmp_path / "data"), encoding="utf-8")
    with serve_process("--config", str(cfg), log=tmp_path / "serve.log") as server:
        assert re.search(r"\(1 worker, 2 slots\); no API keys configured", server.banner), server.banner
        r = httpx.post(server.url + "/v1/completions", json={"model": "sim", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["laneway"]["worker"] == "sim0"
    assert server.proc.returncode is not None  # stopped


SLOW_CONFIG = """
[server]
data_dir = "{data}"
{grace}
[[workers]]
name = "sim0"
type = "simulated"
model = "sim"
slots = 2
tokens_per_s = 20
"""


def _stream(url: str, max_tokens: int, into: dict[str, object]) -> None:
    """Stream a completion; keep its last SSE event before ``[DONE]`` (its last line if it
    has no [DONE]) and when the stream ended."""
    body = {"model": "sim", "prompt": "x", "max_tokens": max_tokens, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line]
    into["done"] = lines[-1] == "data: [DONE]"
    into["last"] = lines[-2] if into["done"] and len(lines) > 1 else lines[-1]
    into["ended"] = time.monotonic()


def _slow_server(tmp_path: Path, grace: str) -> ServeProcess:
    cfg = tmp_path / "slow.toml"
    cfg.write_text(SLOW_CONFIG.format(data=tmp_path / "data", grace=grace), encoding="utf-8")
    return ServeProcess(["--config", str(cfg)], tmp_path / "serve.log")


RUNNING = re.compile(r"^laneway_running_requests\{[^}]*\} ([0-9.]+)$", re.M)


def _start_stream(server: ServeProcess, max_tokens: int) -> tuple[threading.Thread, dict[str, object]]:
    """A streaming request in a thread, once the server runs it."""
    got: dict[str, object] = {}
    before = _running(server)
    t = threading.Thread(target=_stream, args=(server.url, max_tokens, got), daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while _running(server) <= before and time.monotonic() < deadline:
        time.sleep(0.05)
    return t, got


def _running(server: ServeProcess) -> float:
    return sum(float(v) for v in RUNNING.findall(httpx.get(server.url + "/metrics").text))


def _ended_cleanly(server: ServeProcess) -> None:
    server.proc.wait(20)
    server.out.close()
    log = server.text()
    assert "Traceback" not in log and "ERROR" not in log, log
    assert "shutting down: running requests have" in log, log
    assert "force quit" not in log  # uvicorn's hint would say otherwise


def test_ctrl_c_gives_running_requests_the_grace_period_then_ends_them(tmp_path: Path) -> None:
    server = _slow_server(tmp_path, "shutdown_grace_s = 1")
    try:
        long, got_long = _start_stream(server, 1000)  # 50 s at 20 tokens/s
        short, got_short = _start_stream(server, 10)  # 0.5 s: ends within the grace period
        sent = time.monotonic()
        server.proc.send_signal(signal.SIGINT)
        long.join(30)
        short.join(30)
        assert got_short["done"] and '"finish_reason":"length"' in str(got_short["last"])
        assert "the server is shutting down" in str(got_long["last"]), got_long
        assert '"code":"shutting_down"' in str(got_long["last"])
        assert 0.8 < float(got_long["ended"]) - sent < 15  # type: ignore[arg-type]
        _ended_cleanly(server)
        assert server.proc.returncode is not None
    finally:
        server.stop()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_second_ctrl_c_ends_requests_at_once(tmp_path: Path, sig: signal.Signals) -> None:
    server = _slow_server(tmp_path, "")  # the default grace period: 30 s
    try:
        long, got = _start_stream(server, 1000)
        server.proc.send_signal(sig)
        time.sleep(0.5)
        assert long.is_alive()  # still streaming in the grace period
        sent = time.monotonic()
        server.proc.send_signal(sig)
        long.join(30)
        assert "the server is shutting down" in str(got["last"]), got
        assert float(got["ended"]) - sent < 10  # type: ignore[arg-type]
        _ended_cleanly(server)
        assert "ending every request now" in server.text()
    finally:
        server.stop()


def test_batch_lines_in_flight_have_the_grace_period_and_no_line_starts(tmp_path: Path) -> None:
    """SIGTERM with 4 batch lines in flight (2 running, 2 queued: 3 s each) of 6: those 4
    end in the grace period and their results are kept; the other 2 start at the next start.
    (Those in flight were cancelled at once, to run again.)"""
    from batch_util import chat_line, client, submit, wait

    setup = "[batches]\nmax_in_flight = 4"  # (2 slots at 20 tokens/s; a grace of 30 s)
    server = _slow_server(tmp_path, setup)
    try:
        c = client(server.url + "/v1")
        with c:
            batch = submit(c, [chat_line(f"l{i}", max_tokens=60) for i in range(6)])
        deadline = time.monotonic() + 20
        while _running(server) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        sent = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
        assert time.monotonic() - sent > 2.0  # (it waited for them; it exited at once before)
        assert "Traceback" not in server.text()
    finally:
        server.stop()
    again = _slow_server(tmp_path, setup)
    try:
        c = client(again.url + "/v1")
        with c:
            first = c.batches.retrieve(batch.id)
            assert first.request_counts is not None and first.request_counts.completed == 4, first
            done = wait(c, batch.id, timeout_s=30)
            assert done.status == "completed" and done.request_counts.completed == 6, done
    finally:
        again.stop()


def test_sigterm_is_a_clean_stop_with_status_0(tmp_path: Path) -> None:
    """What a container's stop sends: the same graceful shutdown as Ctrl-C, exit 0."""
    cfg = tmp_path / "sim.toml"
    cfg.write_text(SIM_CONFIG.format(data=tmp_path / "data"), encoding="utf-8")
    server = ServeProcess(["--config", str(cfg)], tmp_path / "serve.log")
    try:
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
        log = server.text()
        assert "shutting down" in log and "Traceback" not in log, log
    finally:
        server.stop()


@pytest.mark.parametrize("delay_s", [0.05, 0.5])
def test_ctrl_c_while_it_starts_is_one_line(tmp_path: Path, delay_s: float) -> None:
    """Ctrl-C before the server is up (the modules, the workers still loading): one line,
    status 130, no traceback."""
    script = Path(sys.executable).parent / "laneway"
    cfg = tmp_path / "sim.toml"
    cfg.write_text(SIM_CONFIG.format(data=tmp_path / "data"), encoding="utf-8")
    proc = subprocess.Popen(
        [str(script), "serve", "--config", str(cfg), "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # (a shell's background job would ignore SIGINT; a terminal's does not)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        time.sleep(delay_s)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    if proc.returncode == 0:  # it was up already: the graceful shutdown
        assert "shutting down" in err
    else:
        assert proc.returncode == 130 and err.strip().splitlines()[-1] == "laneway: interrupted", err
    assert "Traceback" not in err, err
