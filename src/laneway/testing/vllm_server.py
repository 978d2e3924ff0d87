"""A real vLLM server (the CPU build) on 127.0.0.1, pinned to cores of its own."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from laneway.testing.process import free_port

VLLM_MAX_MODEL_LEN = 2048  # (vllm_process's engines: a KV cache must hold one such request)
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
