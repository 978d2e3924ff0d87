"""``laneway serve`` as a real subprocess on 127.0.0.1 (a free port), always stopped."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx

START_TIMEOUT_S = 60.0
URL_LINE = re.compile(r"on (http://127\.0\.0\.1:\d+) ")


@contextlib.contextmanager
def serve_process(*args: str) -> Iterator[str]:
    """Run ``laneway serve --port 0 ARGS...``; yield its base URL (``http://127.0.0.1:PORT``)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "laneway.cli", "serve", "--port", "0", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        m = URL_LINE.search(first)
        assert m, f"laneway serve did not start: {first}"
        url = m.group(1)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if httpx.get(url + "/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "laneway serve never became ready"
            time.sleep(0.05)
        yield url
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
