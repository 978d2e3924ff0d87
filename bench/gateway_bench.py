"""The gateway, measured on a real ``laneway serve`` on 127.0.0.1.

    python bench/gateway_bench.py [--only ttft,overhead,throughput] [--model builtin:tiny]
        [--slots 4] [--flood 12] [--flood-tokens 512] [--p0-samples 20] [--fifo-samples 3]
        [--rounds 3] [--overhead-requests 200] [--clients 32] [--sim-slots 32]
        [--duration 5] [--loadgen python|wrk|both] [--json out.json]

Every server is ``laneway serve --config FILE --port 0`` started as a
subprocess (its log goes to a file) and stopped afterwards (SIGINT, then
SIGKILL past a timeout). Every loop is bounded in count and time.

1. P0 time to first token (TTFT) under a flood, ``--model`` on one in-process
   worker with ``--slots`` slots. Each round measures, on the same server, P0
   streaming chat requests on the idle server (one at a time), then the same
   P0 requests while ``--flood`` closed-loop P3 clients keep streaming long
   requests (``--flood-tokens``, ``ignore_eos``): every slot busy and
   ``flood - slots`` P3 requests queued. The figure is median TTFT under the
   flood / median TTFT idle. Once with the ``laneway`` policy (best of
   ``--rounds``), once with ``fifo`` for contrast (one round,
   ``--fifo-samples`` P0 requests: each waits for the queue ahead of it).
2. Added latency: a 1-token completion through the gateway (HTTP → runtime →
   core → worker → back) against the same job on a ``LocalWorker`` with the
   same model in this process, one after the other in pairs, p50 and p99 of
   each; the added latency is their difference. Best of ``--rounds``.
3. Requests/s: ``--clients`` concurrent keep-alive clients sending 1-token
   completions as fast as answered, to a server with one simulated worker
   producing tokens instantly (``--sim-slots`` slots), for ``--duration``
   seconds after a warm-up; best of ``--rounds``. The load generator is a
   small HTTP/1.1 client on asyncio streams in this process (``python``), or
   ``wrk`` if installed. The server's CPU time per request (from /proc) is
   reported too: it varies less than wall-clock figures on a shared machine.

HTTP latency in (2) and (3) is measured with the same small client (a
request is a prebuilt byte string on a kept-alive connection); TTFT in (1)
with httpx streaming, as a client would read it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from laneway.testing import ServeProcess, serve_process

HOST = "127.0.0.1"
STOP_TIMEOUT_S = 20.0
REQUEST_TIMEOUT_S = 120.0  # any single request in this bench
FILL_TIMEOUT_S = 60.0  # for the flood to occupy every slot and its queue

err = Console(stderr=True)


# --------------------------------------------------------------------------- servers
def worker_toml(kind: str, *, model: str = "builtin:tiny", slots: int = 4) -> str:
    if kind == "local":
        return f'[[workers]]\nname = "w0"\ntype = "local"\nmodel = "{model}"\nslots = {slots}\n'
    return (
        '[[workers]]\nname = "sim0"\ntype = "simulated"\nmodel = "sim"\n'
        f'slots = {slots}\ntokens_per_s = "none"\n'
    )


@contextlib.contextmanager
def serve(workers: str, policy: str = "laneway") -> Iterator[ServeProcess]:
    """``laneway serve`` on 127.0.0.1, a free port; always stopped."""
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp:
        d = Path(tmp)
        cfg = d / "laneway.toml"
        cfg.write_text(
            f'[server]\nhost = "{HOST}"\ndata_dir = "{d / "data"}"\npolicy = "{policy}"\n\n{workers}'
        )
        with serve_process("--config", str(cfg), log=d / "server.log") as server:
            yield server


# --------------------------------------------------------------------------- a small HTTP client
def post_bytes(path: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body, separators=(",", ":")).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


class Connection:
    """One kept-alive HTTP/1.1 connection for requests answered with a Content-Length."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(HOST, port)
        return cls(reader, writer)

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        """Send ``raw``; the status and the whole body (with a Content-Length, or chunked:
        an event stream, read to its last chunk)."""
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        i = lower.find(b"content-length:")
        if i >= 0:
            n = int(head[i + 15 : head.index(b"\r\n", i)])
            return status, await self.reader.readexactly(n)
        if b"transfer-encoding: chunked" not in lower:
            raise RuntimeError(f"neither a Content-Length nor chunked in {head!r}")
        parts = []
        for _ in range(1_000_000):  # (bounded: a stream of a million chunks is an error)
            size = int((await self.reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
            chunk = await self.reader.readexactly(size + 2)
            if size == 0:
                return status, b"".join(parts)
            parts.append(chunk[:-2])
        raise RuntimeError("a chunked body of over a million chunks")

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


# --------------------------------------------------------------------------- 1. TTFT under a flood
def chat_body(model: str, priority: int, max_tokens: int, text: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "priority": priority,
        "stream": True,
        **extra,
    }


async def ttft(client: httpx.AsyncClient, body: dict[str, Any]) -> float:
    """Seconds from sending ``body`` to the first streamed text; reads the stream to its end."""
    t0 = time.perf_counter()
    first = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if first is None and line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError("the stream had no text")
    return first


async def _flood_client(client: httpx.AsyncClient, body: dict[str, Any], stop: asyncio.Event) -> int:
    done = 0
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError):  # cut off when the round ends
            async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
                async for _ in resp.aiter_raw():
                    if stop.is_set():
                        break
                done += 1
    return done


async def _queued(client: httpx.AsyncClient) -> int:
    r = await client.get("/v1/queue/estimate", params={"priority": "P3"})
    return int(r.json()["queued"])


@contextlib.asynccontextmanager
async def flooded(url: str, model: str, clients: int, tokens: int, slots: int) -> AsyncIterator[None]:
    """``clients`` closed-loop P3 streams; yields once every slot is busy and the rest queued."""
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=limits) as client:
        tasks = [
            asyncio.create_task(
                _flood_client(client, chat_body(model, 3, tokens, f"batch job {i}", ignore_eos=True), stop)
            )
            for i in range(clients)
        ]
        try:
            deadline = time.monotonic() + FILL_TIMEOUT_S
            while await _queued(client) < clients - slots:
                if time.monotonic() > deadline:
                    raise RuntimeError("the flood did not fill the slots and queue")
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # every slot decoding
            yield
        finally:
            stop.set()
            await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
            for t in tasks:
                t.cancel()


async def ttft_round(args: argparse.Namespace, url: str, samples: int) -> dict[str, Any]:
    body = chat_body(args.served, 0, 8, "hello, are you there?")
    async with httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S) as client:
        for _ in range(3):  # warm-up
            await ttft(client, body)
        idle = []
        for _ in range(samples):
            idle.append(await ttft(client, body))
            await asyncio.sleep(0.02)
        loaded = []
        async with flooded(url, args.served, args.flood, args.flood_tokens, args.slots):
            for i in range(samples):
                loaded.append(await ttft(client, body))
                await asyncio.sleep(0.05 + 0.01 * (i % 7))  # land at different points of a decode step
    ratio = statistics.median(loaded) / statistics.median(idle)
    return {
        "idle_ms": [x * 1e3 for x in idle],
        "flood_ms": [x * 1e3 for x in loaded],
        "idle_p50_ms": statistics.median(idle) * 1e3,
        "flood_p50_ms": statistics.median(loaded) * 1e3,
        "flood_max_ms": max(loaded) * 1e3,
        "ratio": ratio,
    }


def bench_ttft(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    plan = {"laneway": (args.rounds, args.p0_samples), "fifo": (1, args.fifo_samples)}
    for policy in args.policies.split(","):
        rounds, samples = plan[policy]
        err.print(f"[dim]TTFT: {policy} policy, {rounds} round(s)…[/]")
        with serve(worker_toml("local", model=args.model, slots=args.slots), policy) as server:
            runs = [asyncio.run(ttft_round(args, server.url, samples)) for _ in range(rounds)]
        best = min(runs, key=lambda r: r["ratio"])
        out[policy] = {"rounds": runs, "best": best, "ratios": [r["ratio"] for r in runs]}
    return out


# --------------------------------------------------------------------------- 2. added latency
async def overhead_round(worker: Any, port: int, model: str, requests: int, round_no: int) -> dict[str, Any]:
    from laneway.backends.base import stream
    from laneway.generation import Done, Job, SamplingParams

    prompt = "hello, are you there?"
    raw = post_bytes(
        "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
    )
    params = SamplingParams(max_tokens=1, temperature=0.0)
    conn = await Connection.open(port)
    direct, gateway = [], []
    try:
        for i in range(requests):
            job = Job(f"direct-{round_no}-{i}", worker.model, params, prompt=prompt)
            t0 = time.perf_counter()
            async for event in stream(worker, job):
                last = event
            direct.append(time.perf_counter() - t0)
            assert isinstance(last, Done), last
            t0 = time.perf_counter()
            status, body = await conn.request(raw)
            gateway.append(time.perf_counter() - t0)
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {body[:300]!r}")
    finally:
        await conn.close()
    return added(direct, gateway, "gateway")


def added(direct: list[float], through: list[float], name: str) -> dict[str, Any]:
    """p50/p99 (ms) of requests sent ``direct`` and ``through`` laneway (as ``name``), and the difference."""
    r: dict[str, Any] = {}
    for key, xs in (("direct", direct), (name, through)):
        r[f"{key}_p50_ms"] = pct(xs, 50) * 1e3
        r[f"{key}_p99_ms"] = pct(xs, 99) * 1e3
    r["added_p50_ms"] = r[f"{name}_p50_ms"] - r["direct_p50_ms"]
    r["added_p99_ms"] = r[f"{name}_p99_ms"] - r["direct_p99_ms"]
    return r


async def _overhead(args: argparse.Namespace, port: int) -> list[dict[str, Any]]:
    from laneway.backends.local import LocalWorker

    with tempfile.TemporaryDirectory(prefix="gateway-bench-direct-") as tmp:
        worker = await LocalWorker.create("direct", args.model, args.slots, data_dir=Path(tmp))
        try:
            await overhead_round(worker, port, args.served, 20, -1)  # warm-up
            return [
                await overhead_round(worker, port, args.served, args.overhead_requests, n)
                for n in range(args.rounds)
            ]
        finally:
            await worker.close()


def bench_overhead(args: argparse.Namespace) -> dict[str, Any]:
    err.print(f"[dim]added latency: {args.rounds} round(s) of {args.overhead_requests} pairs…[/]")
    with serve(worker_toml("local", model=args.model, slots=args.slots)) as server:
        runs = asyncio.run(_overhead(args, server.port))
    best = min(runs, key=lambda r: r["added_p50_ms"])
    return {"rounds": runs, "best": best}


# --------------------------------------------------------------------------- 3. requests/s
async def _load(port: int, raw: bytes, clients: int, warmup_s: float, duration_s: float) -> dict[str, Any]:
    conns = [await Connection.open(port) for _ in range(clients)]
    start = time.perf_counter() + warmup_s  # not loop.time(): uvloop's ticks in whole milliseconds
    end = start + duration_s
    counted: list[int] = [0]
    errors: list[int] = [0]
    latencies: list[float] = []

    async def client(conn: Connection) -> None:
        while True:
            t0 = time.perf_counter()
            if t0 >= end:
                return
            status, _ = await conn.request(raw)
            t1 = time.perf_counter()
            if t0 >= start:
                if status == 200:
                    counted[0] += 1
                    latencies.append(t1 - t0)
                else:
                    errors[0] += 1

    try:
        await asyncio.wait_for(asyncio.gather(*(client(c) for c in conns)), warmup_s + duration_s + 30)
    finally:
        for c in conns:
            await c.close()
    return {
        "requests": counted[0],
        "errors": errors[0],
        "latency_p50_ms": pct(latencies, 50) * 1e3 if latencies else float("nan"),
        "latency_p99_ms": pct(latencies, 99) * 1e3 if latencies else float("nan"),
    }


def python_load(server: ServeProcess, raw: bytes, args: argparse.Namespace) -> dict[str, Any]:
    warmup = 1.0
    cpu0, own0 = None, None

    async def run() -> dict[str, Any]:
        nonlocal cpu0, own0
        task = asyncio.create_task(_load(server.port, raw, args.clients, warmup, args.duration))
        await asyncio.sleep(warmup)
        cpu0, own0 = server.cpu_s(), time.process_time()
        r = await task
        r["server_cpu_s"] = server.cpu_s() - cpu0
        r["client_cpu_s"] = time.process_time() - own0
        return r

    r = _run_fast(run())
    r["seconds"] = args.duration
    return r


def wrk_load(server: ServeProcess, body: bytes, args: argparse.Namespace) -> dict[str, Any]:
    return wrk(server.url + "/v1/completions", body, args.clients, args.duration, server.cpu_s)


def wrk(url: str, body: bytes, clients: int, duration: float, cpu_s: Any, threads: int = 2) -> dict[str, Any]:
    """``wrk`` POSTing ``body`` to ``url`` from ``clients`` connections over ``threads`` threads
    for ``duration`` seconds (after a 1 s warm-up); ``cpu_s()`` reads the server's CPU seconds."""
    seconds = max(1, round(duration))
    with tempfile.TemporaryDirectory(prefix="gateway-bench-wrk-") as tmp:
        script = Path(tmp) / "post.lua"
        script.write_text(
            'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
            f"wrk.body = {json.dumps(body.decode())}\n"
        )
        base = ["wrk", f"-t{threads}", f"-c{clients}", "--latency", "-s", str(script)]
        subprocess.run([*base, "-d1s", url], capture_output=True, timeout=30, check=True)  # warm-up
        cpu0 = cpu_s()
        done = subprocess.run(
            [*base, f"-d{seconds}s", url],
            capture_output=True,
            text=True,
            timeout=duration + 60,
            check=True,
        )
        cpu = cpu_s() - cpu0
    text = done.stdout
    total = int(re.search(r"(\d+) requests in", text).group(1))  # type: ignore[union-attr]
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    lat = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", text, re.M))
    return {
        "requests": total,
        "errors": int(bad.group(1)) if bad else 0,
        "seconds": seconds,
        "req_per_s": rate,
        "latency_p50_ms": _wrk_ms(lat.get("50")),
        "latency_p99_ms": _wrk_ms(lat.get("99")),
        "server_cpu_s": cpu,
        "client_cpu_s": float("nan"),
    }


def _wrk_ms(value: str | None) -> float:
    if value is None:
        return float("nan")
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", value)
    if m is None:
        return float("nan")
    return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]


def _run_fast(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def bench_throughput(args: argparse.Namespace) -> dict[str, Any]:
    gens = {"python": ["python"], "wrk": ["wrk"], "both": ["python", "wrk"]}[args.loadgen]
    if "wrk" in gens and shutil.which("wrk") is None:
        err.print("[yellow]wrk is not installed: using the python load generator only[/]")
        gens = [g for g in gens if g != "wrk"] or ["python"]
    body = {"model": "sim", "prompt": "hello", "max_tokens": 1}
    raw = post_bytes("/v1/completions", body)
    out: dict[str, Any] = {}
    err.print(f"[dim]requests/s: {args.clients} clients, {' and '.join(gens)}, {args.rounds} round(s)…[/]")
    with serve(worker_toml("simulated", slots=args.sim_slots)) as server:
        runs: dict[str, list[dict[str, Any]]] = {g: [] for g in gens}
        for _ in range(args.rounds):
            for g in gens:  # the generators take turns
                if g == "python":
                    r = python_load(server, raw, args)
                else:
                    r = wrk_load(server, json.dumps(body).encode(), args)
                r.setdefault("req_per_s", r["requests"] / r["seconds"])
                r["server_cpu_us_per_req"] = r["server_cpu_s"] / max(1, r["requests"]) * 1e6
                runs[g].append(r)
    for g, rs in runs.items():
        out[g] = {"rounds": rs, "best": max(rs, key=lambda r: r["req_per_s"])}
    return out


# --------------------------------------------------------------------------- report
def report(results: dict[str, Any], args: argparse.Namespace, console: Console) -> None:
    if "ttft" in results:
        t = Table(
            title=f"P0 time to first token: idle vs under a P3 flood ({args.model}, {args.slots} slots)"
        )
        for col in ("policy", "rounds", "idle p50 ms", "flood p50 ms", "flood max ms", "ratio (best)",
                    "ratios (all rounds)", "target ≤ 1.5"):  # fmt: skip
            t.add_column(col, justify="right")
        for policy, r in results["ttft"].items():
            b = r["best"]
            ok = "yes" if b["ratio"] <= 1.5 else "no"
            t.add_row(
                policy,
                str(len(r["rounds"])),
                f"{b['idle_p50_ms']:.1f}",
                f"{b['flood_p50_ms']:.1f}",
                f"{b['flood_max_ms']:.1f}",
                f"{b['ratio']:.2f}",
                ", ".join(f"{x:.2f}" for x in r["ratios"]),
                ok if policy == "laneway" else "(contrast)",
            )
        console.print(t)
        console.print(
            f"  flood: {args.flood} closed-loop streaming P3 clients, max_tokens {args.flood_tokens}, "
            f"ignore_eos ({args.slots} running, {args.flood - args.slots} queued); P0: chat, 8 tokens, greedy"
        )
    if "overhead" in results:
        t = Table(
            title=f"Added latency of a 1-token completion ({args.model}; {args.overhead_requests} pairs)"
        )
        for col in ("round", "in-process p50 ms", "p99 ms", "through laneway p50 ms", "p99 ms",
                    "added p50 ms", "added p99 ms"):  # fmt: skip
            t.add_column(col, justify="right")
        best = results["overhead"]["best"]
        for i, r in enumerate(results["overhead"]["rounds"]):
            t.add_row(
                f"{i + 1}{' (best)' if r is best else ''}",
                f"{r['direct_p50_ms']:.2f}",
                f"{r['direct_p99_ms']:.2f}",
                f"{r['gateway_p50_ms']:.2f}",
                f"{r['gateway_p99_ms']:.2f}",
                f"{r['added_p50_ms']:.2f}",
                f"{r['added_p99_ms']:.2f}",
            )
        console.print(t)
    if "throughput" in results:
        t = Table(
            title=f"Requests/s: {args.clients} concurrent clients, simulated worker with instant tokens "
            f"({args.sim_slots} slots), 1-token completions, {args.duration:g} s per round"
        )
        for col in ("load generator", "req/s (best)", "req/s (all rounds)", "latency p50 ms", "p99 ms",
                    "server CPU µs/req", "client CPU s", "errors", "target ≥ 1000"):  # fmt: skip
            t.add_column(col, justify="right")
        for g, r in results["throughput"].items():
            b = r["best"]
            t.add_row(
                g,
                f"{b['req_per_s']:.0f}",
                ", ".join(f"{x['req_per_s']:.0f}" for x in r["rounds"]),
                f"{b['latency_p50_ms']:.2f}",
                f"{b['latency_p99_ms']:.2f}",
                f"{b['server_cpu_us_per_req']:.0f}",
                f"{b['client_cpu_s']:.2f}",
                str(b["errors"]),
                "yes" if b["req_per_s"] >= 1000 else "no",
            )
        console.print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="ttft,overhead,throughput", help="comma-separated parts to run")
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--slots", type=int, default=4, help="slots of the in-process worker")
    ap.add_argument("--flood", type=int, default=12, help="concurrent P3 clients (slots + queued)")
    ap.add_argument("--flood-tokens", type=int, default=512, help="max_tokens of each P3 request")
    ap.add_argument("--p0-samples", type=int, default=20, help="P0 requests idle and flooded, per round")
    ap.add_argument("--fifo-samples", type=int, default=3, help="P0 requests under the fifo policy")
    ap.add_argument("--policies", default="laneway,fifo", help="TTFT: laneway, fifo or both")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per measurement; the best is reported")
    ap.add_argument("--overhead-requests", type=int, default=200, help="request pairs per round")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--sim-slots", type=int, default=32)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds of load per round")
    ap.add_argument("--loadgen", choices=("python", "wrk", "both"), default="both")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    parts = {p.strip() for p in args.only.split(",") if p.strip()}
    unknown = parts - {"ttft", "overhead", "throughput"}
    unknown |= set(args.policies.split(",")) - {"laneway", "fifo"}
    if unknown or args.flood <= args.slots or min(args.rounds, args.p0_samples, args.fifo_samples) < 1:
        ap.error(f"bad arguments (unknown: {sorted(unknown)}; --flood must exceed --slots)")
    args.served = args.model if args.model.startswith("builtin:") else Path(args.model).name
    console = Console(width=None if sys.stdout.isatty() else 150)
    console.print(f"[bold]gateway_bench[/]: {os.cpu_count()} CPUs; python {sys.version.split()[0]}")
    results: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "json"}}
    results["args"]["json"] = str(args.json) if args.json else None
    if "ttft" in parts:
        results["ttft"] = bench_ttft(args)
    if "overhead" in parts:
        results["overhead"] = bench_overhead(args)
    if "throughput" in parts:
        results["throughput"] = bench_throughput(args)
    report(results, args, console)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
