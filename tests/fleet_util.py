"""Fleets of declared GPUs whose engines are real processes: the stand-in engine, loading
for a set time (``--load-s``), started and stopped by ``laneway serve``."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx

STANDIN = f'"{sys.executable}" -m laneway.standin --port {{port}} --model {{model}} --ms-per-token {{ms}}'


def standin_model(
    name: str,
    vram_gb: float,
    *,
    gpus: int = 1,
    slots: int = 2,
    load_s: float = 0.3,
    ms_per_token: float = 5.0,
    extra: str = "",
) -> str:
    command = STANDIN.replace("{ms}", f"{ms_per_token:g}") + f" --slots {slots} --load-s {load_s:g}"
    return (
        f"[fleet.models.{name}]\nvram_gb = {vram_gb}\ngpus = {gpus}\nslots = {slots}\n"
        f"load_s = {load_s}\ncommand = '{command}'\nstop_grace_s = 5\n{extra}\n"
    )


def fleet_toml(
    tmp: Path, models: str, *, gpus: str = "", preload: str = "", top: str = "", fleet: str = ""
) -> Path:
    """A configuration of ``models`` on ``gpus`` (two GPUs of 24 GB by default); ``top``: more
    of ``[server]``, ``fleet``: more of ``[fleet]``."""
    gpus = gpus or '[fleet.nodes.a]\ngpus = [ { id = "a0", vram_gb = 24 }, { id = "a1", vram_gb = 24 } ]\n'
    text = (
        f'[server]\ndata_dir = "{tmp / "data"}"\nshutdown_grace_s = 5\n{top}\n'
        f"[fleet]\npreload = [{preload}]\nswitch_wait_s = 1\n{fleet}\n\n{gpus}\n{models}"
    )
    path = tmp / "fleet.toml"
    path.write_text(text, encoding="utf-8")
    return path


def replicas(url: str) -> dict[str, dict[str, Any]]:
    """The fleet's replicas as ``/readyz`` gives them."""
    out: dict[str, dict[str, Any]] = httpx.get(url + "/readyz", timeout=5).json()["fleet"]["replicas"]
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:  # (a zombie is gone but for its parent's wait)
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def group_members(*pgids: int) -> list[int]:
    """The live processes of these process groups (an engine's: its shell, its server …)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            pid = int(entry.name)
            with contextlib.suppress(OSError):
                if os.getpgid(pid) in pgids and alive(pid):
                    out.append(pid)
    return out


def wait_gone(pids: list[int], timeout_s: float = 15.0) -> list[int]:
    """The pids still alive after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def complete(url: str, model: str, max_tokens: int = 4, **body: Any) -> httpx.Response:
    return httpx.post(
        url + "/v1/completions",
        json={"model": model, "prompt": "hello fleet", "max_tokens": max_tokens, **body},
        timeout=60,
    )


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def engine_processes(*parents: int) -> dict[int, dict[str, str]]:
    """The engine processes a fleet started, running now (group leaders with LANEWAY_REPLICA
    in their environment): pid -> {replica, model, gpus}; ``parents``: only those these
    processes started (other tests, and anything else on the machine, run engines too)."""
    out: dict[int, dict[str, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if os.getpgid(pid) != pid or not alive(pid) or (parents and parent_of(pid) not in parents):
                continue
            raw = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(x.decode(errors="replace").split("=", 1) for x in raw if b"=" in x)
        if "LANEWAY_REPLICA" in env:
            out[pid] = {
                "replica": env["LANEWAY_REPLICA"],
                "model": env["LANEWAY_MODEL"],
                "gpus": env["LANEWAY_GPUS"],
            }
    return out
