"""laneway.testing's helpers for tests and benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

SCRIPT = """
import subprocess, sys, time
from laneway.testing import exit_on_sigterm, terminate
if sys.argv[1] == "on":
    exit_on_sigterm()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
try:
    print(child.pid, flush=True)
    time.sleep(60)
finally:
    terminate(child)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # (a zombie not yet reaped by init counts as gone)
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("handled", [True, False])
def test_sigterm_ends_a_benchmark_through_its_cleanup_so_its_engines_stop(handled: bool) -> None:
    child = 0
    with subprocess.Popen(
        [sys.executable, "-c", SCRIPT, "on" if handled else "off"], stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            child = int(proc.stdout.readline())
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == (143 if handled else -signal.SIGTERM)
            deadline = time.monotonic() + 10
            while handled and _alive(child) and time.monotonic() < deadline:
                time.sleep(0.05)
            # with it the child was stopped; without it (SIGTERM's default) it is left running
            assert _alive(child) is not handled
        finally:
            proc.kill()
            if child and _alive(child):
                os.kill(child, signal.SIGKILL)
