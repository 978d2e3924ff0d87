"""``laneway serve`` as a real subprocess on 127.0.0.1 (a free port), its stderr in a log file.

Shipped for the project's tests and benchmarks, and for anyone who wants to
drive a real server from a test of their own.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

START_TIMEOUT_S = 60.0
URL = re.compile(r"on (http://127\.0\.0\.1:\d+) ")


class ServeProcess:
    """``laneway serve --port 0 ARGS...``; ready (``/readyz`` answers 200) once built.

    Several runs may share one ``log`` (a restart appends); ``banner`` is this
    run's first line, ``url`` its base URL.
    """

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        self.start = log.stat().st_size if log.exists() else 0  # this run's lines come after
        self.out = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "laneway.cli", "serve", "--port", "0", *args],
            stdout=subprocess.DEVNULL,
            stderr=self.out,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            self.url = self._wait_ready()
        except BaseException:
            self.stop()
            raise

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def cpu_s(self) -> float:
        """User + system CPU seconds of the server process so far (Linux)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def text(self) -> str:
        """What this run wrote to its log so far."""
        return self.log.read_bytes()[self.start :].decode(errors="replace")

    @property
    def banner(self) -> str:
        return self.text().splitlines()[0]

    def _wait_ready(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            text = self.text()
            urls = URL.findall(text)
            if urls and self.proc.poll() is None:
                try:
                    if httpx.get(urls[-1] + "/readyz", timeout=1).status_code == 200:
                        return str(urls[-1])
                except httpx.TransportError:
                    pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"laneway serve exited: {text}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"laneway serve never became ready: {text}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: a crash."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.out.close()

    def stop(self) -> None:
        """SIGINT (Ctrl-C); a second one if requests still run after 5 s (it ends
        them); SIGKILL if it does not stop."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGINT)
                try:
                    self.proc.wait(20)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
        if not self.out.closed:
            self.out.close()


@contextlib.contextmanager
def serve_process(*args: str, log: Path) -> Iterator[ServeProcess]:
    server = ServeProcess(list(args), log)
    try:
        yield server
    finally:
        server.stop()
