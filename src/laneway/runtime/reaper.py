"""What stops a fleet's engines when laneway dies without stopping them (``kill -9``, OOM).

The kernel's parent-death signal (set in each engine's first process) reaches that process
only, and only as SIGTERM: an engine started through a shell (``sh -c "vllm serve …"``)
leaves its real server running, and one that ignores SIGTERM runs on. So laneway starts,
with its first engine, one small process of its own — this module's :func:`main` — in a
session apart (a Ctrl-C in laneway's terminal does not reach it). laneway tells it, on a
pipe, each engine process group it starts (``+PGID GRACE``) and each it has stopped
(``-PGID``). When the pipe closes — laneway ended, however — it sends what is left
SIGTERM, then SIGKILL after the longest grace, and exits. A laneway that stopped its
engines itself has left it nothing to do (its pipe closes as laneway exits).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import time

log = logging.getLogger("laneway.fleet")


class Reaper:
    """laneway's side: the reaper process and the pipe it reads."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None

    def started(self, pgid: int, grace_s: float) -> None:
        """An engine's process group, to be stopped if laneway dies."""
        self._send(f"+{pgid} {grace_s:g}\n")

    def stopped(self, pgid: int) -> None:
        self._send(f"-{pgid}\n")

    def _send(self, line: str) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            try:
                proc = self._proc = subprocess.Popen(
                    # (imported, not run as ``-m``: its package imports it first, and runpy
                    # would warn of that on every start)
                    [sys.executable, "-c", "from laneway.runtime.reaper import main; main()"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as exc:
                log.warning(
                    "the engines' reaper could not start (%s): a killed laneway may leave engines", exc
                )
                return
        assert proc.stdin is not None
        try:
            proc.stdin.write(line.encode())
            proc.stdin.flush()
        except OSError:
            log.warning("the engines' reaper is gone: a killed laneway may leave engines")


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main() -> None:
    """The reaper: reads ``+PGID GRACE`` / ``-PGID`` lines until its pipe closes, then
    stops the groups left."""
    groups: dict[int, float] = {}
    for raw in sys.stdin.buffer:
        line = raw.decode("ascii", "replace").strip()
        with contextlib.suppress(ValueError, IndexError):
            if line.startswith("+"):
                pgid, grace = line[1:].split()
                groups[int(pgid)] = float(grace)
            elif line.startswith("-"):
                groups.pop(int(line[1:]), None)
    left = [g for g in groups if _alive(g)]
    for g in left:
        with contextlib.suppress(OSError):
            os.killpg(g, signal.SIGTERM)
    if left:
        _wait_gone(left, max(groups[g] for g in left))
    for g in left:
        if _alive(g):
            with contextlib.suppress(OSError):
                os.killpg(g, signal.SIGKILL)


def _members(pgids: set[int]) -> list[int]:
    """The processes of these process groups (Linux: from /proc)."""
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                if int(fields[2]) in pgids:  # (state, ppid, pgrp)
                    out.append(int(entry.name))
    return out


def _wait_gone(pgids: list[int], timeout_s: float) -> None:
    """Until every process of ``pgids`` has exited, or ``timeout_s``: woken by each exit
    (a pidfd per process, readable once it has exited), not by polling."""
    fds = []
    for pid in _members(set(pgids)):
        with contextlib.suppress(OSError):
            fds.append(os.pidfd_open(pid))
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    try:
        deadline = time.monotonic() + timeout_s
        pending = len(fds)
        while pending and (wait_s := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(wait_s * 1000.0):
                poller.unregister(fd)
                pending -= 1
    finally:
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (only its pipe's end ends it)
    main()
