"""Engine processes of a fleet: started on their GPUs, waited for, watched and stopped.

An :class:`EngineProcess` is one replica's engine: the model's command with its
placeholders filled (a free loopback port, the GPUs' CUDA ids), run in a session of
its own with ``CUDA_VISIBLE_DEVICES`` set, its output in ``DATA_DIR/engines/ID.log``.
It is ready when its ``ready_path`` answers 200 on that port; a launch that exits
first, or is not ready in ``ready_timeout_s``, fails with the end of its log.

No engine outlives laneway: each is stopped with SIGTERM to its whole process group
(then SIGKILL after ``stop_grace_s``) when laneway stops; if laneway dies without stopping
it, the kernel sends its first process SIGTERM (Linux's parent-death signal, set in the
child before it runs the engine), and laneway's reaper (:mod:`laneway.runtime.reaper`)
stops its whole group the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import time
from collections import deque
from pathlib import Path

import httpx

from laneway.config.fleet import EngineLaunch
from laneway.runtime.reaper import Reaper

log = logging.getLogger("laneway.fleet")

PR_SET_PDEATHSIG = 1
READY_POLL_S = 0.25
LOG_TAIL_LINES = 12
REAPER = Reaper()  # (one for the process: it stops the engines left if laneway dies)
_GROUPS: set[int] = set()  # the process groups of the engines started and not yet stopped


def kill_engines() -> int:
    """SIGKILL every engine's process group now (the exit forced: no grace waited for);
    how many there were. Their stops under way return at once."""
    groups = list(_GROUPS)
    for pgid in groups:
        _signal_group(pgid, signal.SIGKILL)
    return len(groups)


class LaunchFailed(Exception):
    """The engine exited, or was not ready in time; the message says which, with its log's end."""


def free_port() -> int:
    """A loopback port free now (the engine binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent(parent: int) -> None:  # (runs in the child, between fork and exec)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # laneway died before the signal was armed
        os._exit(1)


class EngineProcess:
    """One replica's engine process."""

    def __init__(
        self,
        replica_id: str,
        model: str,
        launch: EngineLaunch,
        cuda_ids: tuple[int, ...],
        log_dir: Path,
        gpu_ids: tuple[str, ...] = (),
    ) -> None:
        self.gpu_ids = gpu_ids
        self.replica_id = replica_id
        self.model = model
        self.launch = launch
        self.cuda_ids = cuda_ids
        self.port = 0
        self.log_path = log_dir / f"{_safe(replica_id)}.log"
        self.proc: asyncio.subprocess.Process | None = None
        self.started_s = 0.0
        self.ready_s = 0.0  # seconds from launch to ready
        self.stopping = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    async def start(self) -> None:
        """Launch it and wait until it is ready; :class:`LaunchFailed` otherwise (stopped)."""
        self.port = free_port()
        try:
            argv = self.launch.argv(port=self.port, model=self.model, gpus=self.cuda_ids)
        except (ValueError, KeyError, IndexError, AttributeError) as exc:  # (a template the config let by)
            raise LaunchFailed(f"its command cannot be filled in: {exc}") from None
        env = {
            **os.environ,
            **self.launch.env,
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, self.cuda_ids)),
            # (which replica a process is, for people and tools reading the process table)
            "LANEWAY_REPLICA": self.replica_id,
            "LANEWAY_MODEL": self.model,
            "LANEWAY_GPUS": ",".join(self.gpu_ids),
        }
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        parent = os.getpid()
        with self.log_path.open("ab") as out:
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} laneway starts: {argv}\n".encode())
            out.flush()
            try:
                self.proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    env=env,
                    start_new_session=True,  # (its own process group: stopped whole)
                    preexec_fn=lambda: _die_with_parent(parent),
                )
            except OSError as exc:
                raise LaunchFailed(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from None
        REAPER.started(self.proc.pid, self.launch.stop_grace_s)
        _GROUPS.add(self.proc.pid)
        self.started_s = time.monotonic()
        log.info(
            "starting %s (pid %d, port %d, CUDA_VISIBLE_DEVICES=%s)",
            self.replica_id,
            self.proc.pid,
            self.port,
            env["CUDA_VISIBLE_DEVICES"],
        )
        try:
            await self._wait_ready()
        except BaseException:
            await self.stop()
            raise
        self.ready_s = time.monotonic() - self.started_s

    async def _wait_ready(self) -> None:
        assert self.proc is not None
        url = f"http://127.0.0.1:{self.port}{self.launch.ready_path}"
        deadline = time.monotonic() + self.launch.ready_timeout_s
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
            while True:
                if self.proc.returncode is not None:
                    raise LaunchFailed(
                        f"its engine exited with status {self.proc.returncode} before it was ready"
                        f"{self.tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(url)).status_code == 200:
                        return
                if time.monotonic() >= deadline:
                    raise LaunchFailed(
                        f"its engine was not ready in {self.launch.ready_timeout_s:g} s "
                        f"({self.launch.ready_path} did not answer 200){self.tail()}"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.proc.wait(), READY_POLL_S)

    def tail(self) -> str:
        """The last lines of its log, for an error message ('' if none)."""
        try:
            with self.log_path.open("rb") as f:
                lines = deque(f, maxlen=LOG_TAIL_LINES)
        except OSError:
            return ""
        text = b"".join(lines).decode("utf-8", "replace").rstrip()
        return f"; the end of {self.log_path}:\n{text}" if text else ""

    async def wait(self) -> int:
        """Until it exits; its exit status."""
        assert self.proc is not None
        return await self.proc.wait()

    async def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after the grace; returns once it exited."""
        proc = self.proc
        self.stopping = True
        if proc is None:
            return
        if proc.returncode is not None:  # (it exited: what it started may run on in its group)
            _signal_group(proc.pid, signal.SIGKILL)
            REAPER.stopped(proc.pid)
            _GROUPS.discard(proc.pid)
            return
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), self.launch.stop_grace_s)
        except TimeoutError:
            log.warning("%s did not stop in %g s: killed", self.replica_id, self.launch.stop_grace_s)
            _signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()
        _signal_group(proc.pid, signal.SIGKILL)  # (what it left behind in its group)
        REAPER.stopped(proc.pid)
        _GROUPS.discard(proc.pid)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
