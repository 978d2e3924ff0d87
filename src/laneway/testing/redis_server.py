"""A real ``redis-server`` on 127.0.0.1, its data on disk, for tests and fault drills."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from laneway.testing.process import START_TIMEOUT_S, free_port, terminate


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
