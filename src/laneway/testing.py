"""``laneway serve`` as a real subprocess on 127.0.0.1 (a free port), its stderr in a log file.

Shipped for the project's tests and benchmarks, and for anyone who wants to
drive a real server from a test of their own.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

START_TIMEOUT_S = 60.0
VLLM_MAX_MODEL_LEN = 2048  # (vllm_process's engines: a KV cache must hold one such request)
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


def free_port() -> int:
    """A port nothing listens on now (on 127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

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


VLLM_START_TIMEOUT_S = 300.0
VLLM_MODEL_NAME = "tiny"


class VllmProcess:
    """A real vLLM (``VENV/bin/vllm serve MODEL``) on 127.0.0.1:``port``, serving ``tiny``.

    ``VENV`` and ``MODEL`` as ``scripts/vllm-cpu install`` and ``model`` make
    them (its ``serve`` starts the same command). The server runs in a process
    group of its own (vLLM starts an engine process beside its API server), so
    :meth:`stop` and :meth:`kill` end both. Ready once ``/v1/models`` answers.

    ``cpus`` pins the whole server to those cores (``taskset``): a generating
    vLLM on CPU keeps every core it may use busy (its engine and worker
    processes poll), so on a small machine it gets one core and laneway and
    its clients the rest, as an engine on its own GPU would leave them.
    """

    def __init__(
        self,
        venv: Path,
        model: Path,
        port: int,
        log: Path,
        args: tuple[str, ...] = (),
        cpus: str | None = "0",
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/v1"
        self.log = log
        pin = ["taskset", "-c", cpus] if cpus is not None and shutil.which("taskset") else []
        cmd = [
            *pin,
            str(venv / "bin" / "vllm"),
            "serve",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--max-model-len",
            str(VLLM_MAX_MODEL_LEN),
            "--max-num-seqs",
            "4",
            "--enforce-eager",
            "--served-model-name",
            VLLM_MODEL_NAME,
            *args,
        ]
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            **(env or {}),
        }
        if pin:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(cpus)
        self.out = log.open("ab")
        self.proc = subprocess.Popen(
            cmd, stdout=self.out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            self._wait_ready()
        except BaseException:
            self.kill()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + VLLM_START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                tail = self.log.read_bytes()[-3000:].decode(errors="replace")
                raise RuntimeError(f"vllm serve exited ({self.proc.returncode}): {tail}")
            try:
                if httpx.get(self.url + "/models", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve was not ready within {VLLM_START_TIMEOUT_S:g} s")
            time.sleep(0.5)

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def pause(self) -> None:
        """SIGSTOP to the whole group: a hung server (it keeps its connections, answers nothing)."""
        self._signal(signal.SIGSTOP)

    def unpause(self) -> None:
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL to the whole group: a crash."""
        self._signal(signal.SIGKILL)
        self.proc.wait(30)
        if not self.out.closed:
            self.out.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.unpause()
            self._signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(20)
        self.kill()


@contextlib.contextmanager
def vllm_process(
    venv: Path,
    model: Path,
    log: Path,
    *args: str,
    port: int | None = None,
    cpus: str | None = "0",
    env: dict[str, str] | None = None,
) -> Iterator[VllmProcess]:
    server = VllmProcess(venv, model, port or free_port(), log, tuple(args), cpus, env)
    try:
        yield server
    finally:
        server.stop()


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


class RedisProcess:
    """``redis-server`` on 127.0.0.1 (a free port), its data (append-only file on, as laneway
    asks of a production Redis) in ``data_dir``; ready once it answers PING.

    For fault tests it can be killed, paused and started again on the same port, from its
    own data, from a copy taken earlier (:meth:`copy_data`), or empty."""

    def __init__(self, data_dir: Path, port: int | None = None, *, fsync: str = "always") -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
        data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = data_dir
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.args = [exe, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(data_dir)]
        self.args += ["--appendonly", "yes", "--appendfsync", fsync, "--save", "", "--daemonize", "no"]
        self._log = (data_dir / "redis.log").open("ab")
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._pong():
            if proc.poll() is not None or time.monotonic() > deadline:
                terminate(proc)
                raise RuntimeError(f"redis-server did not start (see {self.data_dir / 'redis.log'})")
            time.sleep(0.02)
        return proc

    def _pong(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: a crash (what was not yet written to its append-only file is lost)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def unpause(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def restart(self, *, data: Path | None = None, empty: bool = False) -> None:
        """Start again (after :meth:`kill`) on the same port: from its own data, from ``data``
        (a copy made by :meth:`copy_data`), or with none."""
        if self.proc.poll() is None:
            self.kill()
        if empty or data is not None:
            for name in ("appendonlydir", "dump.rdb"):
                target = self.data_dir / name
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
            if data is not None:
                shutil.copytree(data, self.data_dir / "appendonlydir")
        self.proc = self._start()

    def copy_data(self, dest: Path) -> Path:
        """A copy of its data as it is on disk now (for a restart from an older copy)."""
        shutil.copytree(self.data_dir / "appendonlydir", dest)
        return dest

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        terminate(self.proc)
        self._log.close()


@contextlib.contextmanager
def redis_process(data_dir: Path) -> Iterator[RedisProcess]:
    r = RedisProcess(data_dir)
    try:
        yield r
    finally:
        r.stop()
