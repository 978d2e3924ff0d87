"""laneway in front of an engine over HTTP, measured side by side with the engine used directly.

    python bench/upstream_bench.py [--only flood,overhead,vllm,gate] [--traces] [--batch 200] [--tokens 1000]
        [--urgent 20] [--urgent-tokens 16] [--slots 4] [--ms-per-token 2] [--requests 2000]
        [--clients 32] [--duration 5] [--vllm VENV --vllm-model DIR] [--gate-slots 16] [--gate-batch 64]
        [--hold-s S] [--isolate] [--json out.json]

Every engine and server is a subprocess on 127.0.0.1 (logs in a temporary
directory), stopped afterwards; every loop is bounded in count and time.

1. **Flood** (``flood``): the stand-in engine (``python -m laneway.standin``:
   ``--slots`` sequences at ``--ms-per-token``, its own FIFO queue beyond them)
   alone ("direct"), then behind ``laneway serve`` with one upstream worker of
   as many slots. On each, urgent requests (streamed, ``--urgent-tokens``) are
   timed one at a time on the idle engine, then ``--batch`` batch requests of
   ``--tokens`` tokens are sent at once (P2 through laneway) and, while they
   run, ``--urgent`` urgent requests (P0) one a second. Reported: the urgent
   requests' latency and time to first token, under the flood ÷ idle (target
   ≤ 1.2 through laneway), and the batch's makespan through laneway ÷ direct
   (the engine's FIFO).
2. **Overhead** (``overhead``): the stand-in answering at once (64 slots), on
   three paths: 1-token completions, chat completions, and chat completions
   streamed to the client. laneway runs alone on the last core, the engine
   and the clients on the others (with fewer cores, all share). Added
   latency: ``--requests`` requests of each path, each sent directly and
   through laneway in turn on kept-alive connections (a stream read to its
   end), p50/p99 of each and the difference (target ≤ 1 ms p50).
   Requests/s: ``--clients`` connections through laneway for ``--duration``
   s (``wrk`` if installed, else a small asyncio client; target ≥ 2,000),
   the engine alone beside it. ``--traces``: each path again with
   OpenTelemetry traces on (a span per request and per run, sent over
   OTLP/HTTP to a local sink), beside the same laneway without.
3. **vLLM** (``vllm``, with ``--vllm``): the flood of (1) against a real vLLM
   (``scripts/vllm-cpu``), pinned to one core (it keeps every core it may
   use busy), laneway and the clients on the others; a smaller flood
   (``--vllm-batch``, ``--vllm-tokens``) as it is slower.
4. **The saturation gate** (``gate``, with ``--vllm``): the same real vLLM
   (``--slots`` sequences at most, its own FCFS queue beyond them) behind
   laneway given too high a ``slots`` (``--gate-slots``), with the gate
   (``adapt_slots``, the default) and without: urgent requests idle and under
   the flood, and the most requests vLLM's own queue held (its ``/metrics``,
   read every 0.25 s). Without the gate the flood waits inside vLLM and an
   urgent request behind it; with it, in laneway, where priority holds. Beside
   them, the engine's floor: urgent requests straight to vLLM beside ``--slots``
   − 1 batch requests kept in flight, so that they never wait in its queue —
   the most a gateway gives them without stopping all the engine's other work;
   and ``--slots`` kept in flight, one stopped just before each urgent request
   (what it costs the engine to swap a request, as a preemption does).
   With ``--isolate`` laneway's worker is ``isolate = true``: each urgent request
   stops the batch work beside it, which resumes after it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from chat_stream import urgent
from gateway_bench import _run_fast
from laneway.testing import exit_on_sigterm, serve_process, standin_process, vllm_process
from upstream_overhead import bench_overhead, gateway_toml, overhead_table

HOST = "127.0.0.1"
REQUEST_TIMEOUT_S = 900.0
err = Console(stderr=True)


# --------------------------------------------------------------------------- servers
@contextlib.contextmanager
def gateway(tmp: Path, url: str, model: str, slots: int, worker: str = "") -> Iterator[str]:
    """``laneway serve`` with one upstream worker in front of ``url`` (``worker``: more of
    its configuration): its ``/v1`` URL."""
    cfg = tmp / "laneway.toml"
    cfg.write_text(gateway_toml(tmp / "data", url, model, slots, worker))
    with serve_process("--config", str(cfg), log=tmp / "laneway.log") as server:
        yield server.url + "/v1"


# --------------------------------------------------------------------------- 1. the flood
def chat(model: str, tokens: int, text: str, priority: str | None, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    if priority is not None:
        body["priority"] = priority
    if stream:
        body["stream"] = True
    return body


async def idle_urgent(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], n: int
) -> list[tuple[float, float]]:
    """``n`` urgent requests one at a time on the idle engine (after 3 to warm up)."""
    for _ in range(3):
        await urgent(client, url, body)
    idle = []
    for _ in range(n):
        idle.append(await urgent(client, url, body))
        await asyncio.sleep(0.05)
    return idle


async def under_load(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    n: int,
    over: Callable[[], bool] = lambda: False,
    before: Callable[[int], None] | None = None,
) -> list[tuple[float, float]]:
    """Up to ``n`` urgent requests, one a second (off the engine's step), a second after the
    load began, until ``over()``; ``before(i)`` runs before the ``i``-th is sent."""
    await asyncio.sleep(1.0)  # every slot busy, the rest queued
    loaded = []
    for i in range(n):
        if over():
            break
        if before is not None:
            before(i)
            await asyncio.sleep(0)  # (what it did reaches the engine before the urgent one)
        loaded.append(await urgent(client, url, body))
        await asyncio.sleep(max(0.0, 1.0 - loaded[-1][1]) + 0.013 * (i % 7))
    return loaded


def against_idle(idle: list[tuple[float, float]], loaded: list[tuple[float, float]]) -> dict[str, float]:
    """Medians of the urgent requests' time to first token and latency, idle and under load
    (and the slowest under load), and their ratios."""
    out: dict[str, float] = {}
    for name, i in (("ttft", 0), ("latency", 1)):
        idle_ms = [x[i] * 1e3 for x in idle]
        flood_ms = [x[i] * 1e3 for x in loaded]
        out[f"idle_{name}_p50_ms"] = statistics.median(idle_ms)
        out[f"flood_{name}_p50_ms"] = statistics.median(flood_ms) if flood_ms else float("nan")
        out[f"flood_{name}_max_ms"] = max(flood_ms) if flood_ms else float("nan")
        out[f"{name}_ratio"] = out[f"flood_{name}_p50_ms"] / out[f"idle_{name}_p50_ms"]
    return out


async def flood(
    url: str, model: str, args: argparse.Namespace, batch: int, tokens: int, via: bool
) -> dict[str, Any]:
    """Urgent requests idle, then under ``batch`` requests of ``tokens``; the batch's makespan."""
    limits = httpx.Limits(max_connections=batch + 16, max_keepalive_connections=batch + 16)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        hot = chat(model, args.urgent_tokens, "hotfix, are you there?", "P0" if via else None, True)
        idle = await idle_urgent(client, url, hot, args.urgent)
        start = time.perf_counter()
        ends: list[float] = []

        async def job(i: int) -> None:
            body = chat(model, tokens, f"batch job {i}", "P2" if via else None, False)
            r = await client.post(url + "/chat/completions", json=body)
            if r.status_code != 200:
                raise RuntimeError(f"batch job {i}: HTTP {r.status_code}: {r.text[:300]}")
            ends.append(time.perf_counter())

        jobs = [asyncio.create_task(job(i)) for i in range(batch)]
        loaded = await under_load(client, url, hot, args.urgent, over=lambda: all(j.done() for j in jobs))
        await asyncio.wait_for(asyncio.gather(*jobs), REQUEST_TIMEOUT_S)
    makespan = max(ends) - start
    return {"makespan_s": makespan, "urgent_under_flood": len(loaded), **against_idle(idle, loaded)}


async def beside(
    url: str, model: str, args: argparse.Namespace, running: int, stop_one: bool = False
) -> dict[str, Any]:
    """Urgent requests straight to the engine, idle and then beside ``running`` batch requests
    kept in flight (each streamed, as laneway reads its upstream; the next sent as one ends).
    With one sequence fewer than the engine runs: its own floor for an urgent request that
    never waits in its queue. ``stop_one``: before each urgent request one of them is stopped
    (its stream closed, so that the engine aborts it) and sent again after — a client that
    preempts on its own, as laneway does for P0 when the engine is full."""
    limits = httpx.Limits(max_connections=running + 16, max_keepalive_connections=running + 16)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        hot = chat(model, args.urgent_tokens, "hotfix, are you there?", None, True)
        idle = await idle_urgent(client, url, hot, args.urgent)
        stop = asyncio.Event()
        current: dict[int, asyncio.Task[tuple[float, float]]] = {}

        async def keep(k: int) -> None:
            for i in range(10_000):
                if stop.is_set():
                    return
                body = chat(model, args.vllm_tokens, f"batch job {k}.{i}", None, True)
                current[k] = asyncio.create_task(urgent(client, url, body))
                with contextlib.suppress(asyncio.CancelledError):
                    await current[k]

        keepers = [asyncio.create_task(keep(k)) for k in range(running)]

        def stop_a_keeper(i: int) -> None:  # (its stream closed before the urgent one is sent)
            current[i % running].cancel()

        loaded = await under_load(client, url, hot, args.urgent, before=stop_a_keeper if stop_one else None)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*keepers), REQUEST_TIMEOUT_S)
    return {"running": running, "stop_one": stop_one, **against_idle(idle, loaded)}


def flood_pair(
    engine_url: str, model: str, args: argparse.Namespace, batch: int, tokens: int
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="upstream-bench-") as tmp:
        err.print(f"[dim]  direct: {batch} × {tokens} tokens, {args.urgent} urgent…[/]")
        direct = _run_fast(flood(engine_url, model, args, batch, tokens, via=False))
        with gateway(Path(tmp), engine_url, model, args.slots) as url:
            err.print(f"[dim]  laneway: {batch} × {tokens} tokens, {args.urgent} urgent…[/]")
            via = _run_fast(flood(url, model, args, batch, tokens, via=True))
    via["makespan_vs_direct"] = via["makespan_s"] / direct["makespan_s"]
    return {"direct": direct, "laneway": via, "batch": batch, "tokens": tokens}


def bench_flood(args: argparse.Namespace) -> dict[str, Any]:
    err.print(f"[dim]flood on the stand-in ({args.slots} slots, {args.ms_per_token} ms/token)…[/]")
    with tempfile.TemporaryDirectory(prefix="upstream-bench-engine-") as tmp:
        engine_args = ("--slots", str(args.slots), "--ms-per-token", str(args.ms_per_token))
        with standin_process(Path(tmp) / "standin.log", *engine_args) as engine:
            return flood_pair(engine.url, "standin", args, args.batch, args.tokens)


def bench_vllm(args: argparse.Namespace) -> dict[str, Any]:
    if args.vllm is None or args.vllm_model is None:
        raise SystemExit("upstream_bench: --only vllm needs --vllm VENV --vllm-model DIR")
    err.print("[dim]flood on a real vLLM (pinned to core 0)…[/]")
    with tempfile.TemporaryDirectory(prefix="upstream-bench-vllm-") as tmp:
        log = Path(tmp) / "vllm.log"
        with vllm_process(
            Path(args.vllm), Path(args.vllm_model), log, "--max-num-seqs", str(args.slots)
        ) as v:
            return flood_pair(v.url, "tiny", args, args.vllm_batch, args.vllm_tokens)


def engine_waiting(metrics_url: str, stop: threading.Event, seen: list[int]) -> None:
    """The requests waiting in vLLM's own queue, read from its /metrics until ``stop``."""
    with httpx.Client(timeout=5) as client:
        while not stop.wait(0.25):
            with contextlib.suppress(httpx.HTTPError):
                text = client.get(metrics_url).text
                got = re.findall(r"^vllm:num_requests_waiting\{[^}]*\} (\S+)$", text, re.M)
                seen.append(round(sum(float(v) for v in got)))


def bench_gate(args: argparse.Namespace) -> dict[str, Any]:
    if args.vllm is None or args.vllm_model is None:
        raise SystemExit("upstream_bench: --only gate needs --vllm VENV --vllm-model DIR")
    out: dict[str, Any] = {"batch": args.gate_batch, "tokens": args.vllm_tokens, "slots": args.gate_slots}
    with tempfile.TemporaryDirectory(prefix="upstream-bench-gate-") as tmp:
        log = Path(tmp) / "vllm.log"
        with vllm_process(
            Path(args.vllm), Path(args.vllm_model), log, "--max-num-seqs", str(args.slots)
        ) as v:
            err.print(f"[dim]gate: the engine's floor, {args.slots - 1} batch requests beside P0, direct…[/]")
            out["floor"] = _run_fast(beside(v.url, "tiny", args, args.slots - 1))
            err.print(f"[dim]gate: {args.slots} batch requests, one stopped for each P0, direct…[/]")
            out["stop one"] = _run_fast(beside(v.url, "tiny", args, args.slots, stop_one=True))
            for name, adapt in (("without the gate", False), ("with the gate", True)):
                err.print(
                    f"[dim]gate: vLLM of {args.slots} sequences, laneway slots {args.gate_slots}, {name}…[/]"
                )
                stop, waiting = threading.Event(), []
                watcher = threading.Thread(
                    target=engine_waiting, args=(v.url.removesuffix("/v1") + "/metrics", stop, waiting)
                )
                here = Path(tmp) / name.replace(" ", "-")
                here.mkdir()
                worker = f"adapt_slots = {'true' if adapt else 'false'}\n"
                if args.isolate:
                    worker += "isolate = true\n"
                if args.hold_s is not None:
                    worker += f"\n[scheduler]\nhold_s = {args.hold_s}\n"
                with gateway(here, v.url, "tiny", args.gate_slots, worker) as url:
                    watcher.start()
                    try:
                        r = _run_fast(flood(url, "tiny", args, args.gate_batch, args.vllm_tokens, via=True))
                    finally:
                        stop.set()
                        watcher.join(10)
                r["engine_waiting_max"] = max(waiting, default=0)
                out[name] = r
    return out


# --------------------------------------------------------------------------- report
def flood_table(title: str, r: dict[str, Any]) -> Table:
    t = Table(title=f"{title}: {r['batch']} batch × {r['tokens']} tokens, urgent requests idle and under it")
    cols = ("path", "idle ms", "flood ms", "flood max ms", "÷ idle", "TTFT idle", "TTFT flood", "TTFT ÷ idle",
            "makespan s", "÷ direct")  # fmt: skip
    for c in cols:
        t.add_column(c, justify="right")
    for name in ("direct", "laneway"):
        x = r[name]
        t.add_row(
            name,
            f"{x['idle_latency_p50_ms']:.1f}",
            f"{x['flood_latency_p50_ms']:.1f}",
            f"{x['flood_latency_max_ms']:.1f}",
            f"{x['latency_ratio']:.2f}",
            f"{x['idle_ttft_p50_ms']:.1f}",
            f"{x['flood_ttft_p50_ms']:.1f}",
            f"{x['ttft_ratio']:.2f}",
            f"{x['makespan_s']:.1f}",
            f"{x.get('makespan_vs_direct', 1.0):.3f}",
        )
    t.caption = "urgent: P0 through laneway; ms are medians (p50); targets through laneway: ÷ idle ≤ 1.2"
    return t


def gate_table(r: dict[str, Any]) -> Table:
    t = Table(
        title=f"the saturation gate: a vLLM of a few sequences given slots = {r['slots']}; "
        f"{r['batch']} P2 × {r['tokens']} tokens, P0 idle and under it"
    )
    for c in (
        "",
        "TTFT idle ms",
        "TTFT flood ms",
        "TTFT ÷ idle",
        "latency ÷ idle",
        "vLLM queue max",
        "makespan s",
    ):
        t.add_column(c, justify="right")
    for name in ("without the gate", "with the gate"):
        x = r[name]
        t.add_row(
            name,
            f"{x['idle_ttft_p50_ms']:.1f}",
            f"{x['flood_ttft_p50_ms']:.1f}",
            f"{x['ttft_ratio']:.2f}",
            f"{x['latency_ratio']:.2f}",
            str(x["engine_waiting_max"]),
            f"{x['makespan_s']:.1f}",
        )
    alone = (("floor", "vLLM alone, {} beside P0"), ("stop one", "vLLM alone, {}, one stopped per P0"))
    for key, label in alone:
        if key in r:
            f = r[key]
            t.add_row(
                label.format(f["running"]),
                f"{f['idle_ttft_p50_ms']:.1f}",
                f"{f['flood_ttft_p50_ms']:.1f}",
                f"{f['ttft_ratio']:.2f}",
                f"{f['latency_ratio']:.2f}",
                "0",
                "–",
            )
    t.caption = (
        "medians (p50); target with the gate: TTFT ÷ idle ≤ 1.2. Last rows, straight to vLLM: "
        "one sequence fewer than it runs kept busy, so that P0 never waits in its queue (what the "
        "engine itself gives P0 beside that work); as many as it runs, one of them stopped (aborted) "
        "just before each P0 (a client preempting on its own)"
    )
    return t


def report(results: dict[str, Any], console: Console) -> None:
    if "flood" in results:
        console.print(flood_table("stand-in engine", results["flood"]))
    if "vllm" in results:
        console.print(flood_table("real vLLM (CPU, one core)", results["vllm"]))
    if "gate" in results:
        console.print(gate_table(results["gate"]))
    if "overhead" in results:
        console.print(overhead_table(results["overhead"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="flood,overhead,vllm")
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--urgent", type=int, default=20)
    ap.add_argument("--urgent-tokens", type=int, default=16)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--ms-per-token", type=float, default=2.0)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument(
        "--wrk-threads", type=int, default=2, help="wrk's threads (they share a core with the engine here)"
    )
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--vllm", metavar="VENV")
    ap.add_argument("--vllm-model", metavar="DIR")
    ap.add_argument("--vllm-batch", type=int, default=24)
    ap.add_argument("--vllm-tokens", type=int, default=400)
    ap.add_argument(
        "--gate-batch",
        type=int,
        default=64,
        help="gate: P2 requests of the flood (long enough for ~20 urgent requests under it)",
    )
    ap.add_argument(
        "--gate-slots", type=int, default=16, help="gate: laneway's slots for the vLLM (too many)"
    )
    ap.add_argument(
        "--hold-s",
        type=float,
        default=None,
        help="gate: laneway's [scheduler] hold_s (default: the server's, 0.25 s)",
    )
    ap.add_argument(
        "--isolate",
        action="store_true",
        help="gate: the upstream worker isolate = true (P0 runs with no batch work beside it)",
    )
    ap.add_argument(
        "--traces",
        action="store_true",
        help="overhead: also with OpenTelemetry traces on (laneway[otel]), sent to a local OTLP sink",
    )
    ap.add_argument("--json", type=Path, metavar="FILE")
    args = ap.parse_args(argv)
    parts = set(args.only.split(","))
    if parts & {"vllm", "gate"} and args.vllm is None:
        parts -= {"vllm", "gate"}
        err.print("[yellow]no --vllm VENV: the real-vLLM flood and gate are left out[/]")
    results: dict[str, Any] = {}
    if "flood" in parts:
        results["flood"] = bench_flood(args)
    if "overhead" in parts:
        results["overhead"] = bench_overhead(args)
    if "vllm" in parts:
        results["vllm"] = bench_vllm(args)
    if "gate" in parts:
        results["gate"] = bench_gate(args)
    report(results, Console(width=170) if not sys.stdout.isatty() else Console())
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    exit_on_sigterm()  # (the engines it started stop with it)
    sys.exit(main())
