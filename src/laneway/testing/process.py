"""Processes a test starts: a free port, a stop that always ends them, SIGTERM unwinding."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

START_TIMEOUT_S = 60.0


def free_port() -> int:
    """A port nothing listens on now (on 127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def exit_on_sigterm() -> None:
    """Make SIGTERM end this process as Ctrl-C does, through its ``finally`` blocks and
    context managers, so that the servers and engines it started are stopped too (a
    benchmark killed by ``timeout`` or its job's end would leave them running)."""

    def _exit(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not gone within 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
