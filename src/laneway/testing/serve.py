"""``laneway serve`` and the stand-in engine as real subprocesses on 127.0.0.1 (free ports)."""

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

from laneway.testing.process import START_TIMEOUT_S, cpu_seconds, free_port, terminate

URL = re.compile(r"on (http://127\.0\.0\.1:\d+) ")


class ServeProcess:
    """``laneway serve --port 0 ARGS...``; ready (``/readyz`` answers 200) once built,
    or, with ``ready=False``, once it listens (its workers may be down).

    Several runs may share one ``log`` (a restart appends); ``banner`` is this
    run's first line, ``url`` its base URL.
    """

    def __init__(
        self, args: list[str], log: Path, *, ready: bool = True, python: str = sys.executable
    ) -> None:
        self.args = list(args)
        self.ready = ready
        self.log = log
        self.start = log.stat().st_size if log.exists() else 0  # this run's lines come after
        self.out = log.open("ab")
        self.proc = subprocess.Popen(
            [python, "-m", "laneway.cli", "serve", "--port", "0", *args],
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
        return cpu_seconds(self.proc.pid)

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
                    status = httpx.get(urls[-1] + "/readyz", timeout=1).status_code
                    if status == 200 or not self.ready:
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
def serve_process(
    *args: str, log: Path, ready: bool = True, python: str = sys.executable
) -> Iterator[ServeProcess]:
    """``laneway serve`` (run by ``python``: another virtual environment's) while in the block."""
    server = ServeProcess(list(args), log, ready=ready, python=python)
    try:
        yield server
    finally:
        server.stop()


class StandInProcess:
    """``python -m laneway.standin --port PORT ARGS...`` (the stand-in engine), ready once
    ``/v1/models`` answers; its output in ``log``."""

    def __init__(
        self, log: Path, args: tuple[str, ...] = (), port: int | None = None, python: str = sys.executable
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.out = log.open("ab")
        self.proc = subprocess.Popen(
            [python, "-m", "laneway.standin", "--port", str(self.port), *args],
            stdout=self.out,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                if httpx.get(self.url + "/models", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the stand-in engine did not start: {log.read_text(errors='replace')}")
            time.sleep(0.05)

    def cpu_s(self) -> float:
        """User + system CPU seconds of the stand-in engine's process so far (Linux)."""
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        terminate(self.proc)
        self.out.close()


@contextlib.contextmanager
def standin_process(log: Path, *args: str, python: str = sys.executable) -> Iterator[StandInProcess]:
    engine = StandInProcess(log, tuple(args), python=python)
    try:
        yield engine
    finally:
        engine.stop()
