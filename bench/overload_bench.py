"""laneway's default configuration at ten times its capacity: what it sheds, what it keeps.

    python bench/overload_bench.py [--slots 8] [--service-s 0.5] [--overload 10] [--duration 60]
        [--p0-share 0.5] [--json out.json]

One ``laneway serve`` on 127.0.0.1 with nothing but a simulated worker of
``--slots`` slots (each request ``--service-s`` long) — no queue bound or
limit configured: the defaults (``max_queued_total``, ``max_wait_s``,
``max_queued_bytes``) are what is measured. Capacity is slots ÷ service time.

1. idle: P0 requests one at a time (the reference latency);
2. flood: for ``--duration`` s, requests arrive open-loop at ``--overload`` ×
   capacity, P0 at ``--p0-share`` of capacity (P0 alone must fit) and the rest
   P3, each on its own connection (the client waits up to 900 s);
3. recovery: from the end of the flood until every accepted request has been
   answered, then P0 alone again.

Reported: P0 latency under the flood ÷ idle (p50, p99), how much P3 was shed
and with which status, code and ``Retry-After``, the server's RSS before /
at its peak / after, and the recovery time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gateway_bench import pct, post_bytes
from laneway.testing import ServeProcess, serve_process

HOST = "127.0.0.1"
CLIENT_TIMEOUT_S = 900.0
RECOVERY_LIMIT_S = 900.0
err = Console(stderr=True)


@contextlib.contextmanager
def server(slots: int, service_s: float, tokens: int) -> Iterator[ServeProcess]:
    with tempfile.TemporaryDirectory(prefix="overload-bench-") as tmp:
        d = Path(tmp)
        cfg = d / "laneway.toml"
        cfg.write_text(
            f'[server]\nhost = "{HOST}"\ndata_dir = "{d / "data"}"\n\n'
            f'[[workers]]\nname = "sim0"\ntype = "simulated"\nmodel = "sim"\nslots = {slots}\n'
            f"tokens_per_s = {tokens / service_s}\n"
        )
        with serve_process("--config", str(cfg), log=d / "server.log") as s:
            yield s


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Outcome:
    cls: int
    status: int
    latency_s: float
    code: str | None = None
    retry_after: int | None = None


@dataclass
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)  # client-side errors


async def one(port: int, raw: bytes, cls: int, run: Run) -> None:
    t0 = time.perf_counter()
    writer = None
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(raw)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), CLIENT_TIMEOUT_S)
        status = int(head[9:12])
        headers = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
        headers = {k.strip().lower(): v.strip() for k, v in headers.items()}
        body = await reader.readexactly(int(headers[b"content-length"]))
        latency = time.perf_counter() - t0
        code = None
        if status != 200:
            code = json.loads(body)["error"].get("code")
        retry = headers.get(b"retry-after")
        run.outcomes.append(Outcome(cls, status, latency, code, int(retry) if retry else None))
    except (OSError, asyncio.IncompleteReadError, TimeoutError, KeyError, ValueError) as exc:
        run.failures[type(exc).__name__] += 1
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def body(cls: int, tokens: int) -> bytes:
    return post_bytes(
        "/v1/completions", {"model": "sim", "prompt": "x", "max_tokens": tokens, "priority": cls}
    )


async def idle_p0(port: int, tokens: int, n: int) -> list[float]:
    run = Run()
    for _ in range(n):
        await one(port, body(0, tokens), 0, run)
    return [o.latency_s for o in run.outcomes if o.status == 200]


async def flood(s: ServeProcess, args: argparse.Namespace) -> dict[str, Any]:
    port, pid = s.port, s.proc.pid
    capacity = args.slots / args.service_s
    rate = args.overload * capacity
    p0_every = max(1, round(rate / (args.p0_share * capacity)))
    n = int(rate * args.duration)
    raw0, raw3 = body(0, args.tokens), body(3, args.tokens)
    run = Run()
    rss: list[tuple[float, float]] = []
    before = rss_mb(pid)
    tasks: set[asyncio.Task[None]] = set()
    t0 = time.perf_counter()
    sampler_stop = asyncio.Event()

    async def sample() -> None:
        while not sampler_stop.is_set():
            rss.append((time.perf_counter() - t0, rss_mb(pid)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sampler_stop.wait(), 0.25)

    sampler = asyncio.create_task(sample())
    err.print(f"flood: {n} requests at {rate:.0f}/s for {args.duration:g} s (1 in {p0_every} P0)")
    for i in range(n):
        due = t0 + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        cls = 0 if i % p0_every == 0 else 3
        task = asyncio.create_task(one(port, raw0 if cls == 0 else raw3, cls, run))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    ended = time.perf_counter()
    err.print(f"flood over after {ended - t0:.1f} s; {len(tasks)} requests still open")
    deadline = ended + RECOVERY_LIMIT_S
    while tasks and time.perf_counter() < deadline:
        await asyncio.sleep(0.2)
    recovered = time.perf_counter()
    sampler_stop.set()
    await sampler
    for t in list(tasks):
        t.cancel()
    after_p0 = await idle_p0(port, args.tokens, 10)
    after = rss_mb(pid)
    return {
        "run": run,
        "offered_per_s": rate,
        "sent": n,
        "send_s": ended - t0,
        "recovery_s": recovered - ended,
        "unfinished": len(tasks),
        "rss_before_mb": before,
        "rss_peak_mb": max(v for _, v in rss),
        "rss_after_mb": after,
        "p0_after_p50_s": statistics.median(after_p0) if after_p0 else float("nan"),
    }


def summarize(idle: list[float], got: dict[str, Any]) -> dict[str, Any]:
    run: Run = got.pop("run")
    p0 = [o.latency_s for o in run.outcomes if o.cls == 0 and o.status == 200]
    p0_all = [o for o in run.outcomes if o.cls == 0]
    p3 = [o for o in run.outcomes if o.cls == 3]
    shed = [o for o in p3 if o.status != 200]
    by = Counter(f"{o.status} {o.code}" for o in shed)
    retry = [o.retry_after for o in shed if o.retry_after is not None]
    idle50, idle99 = statistics.median(idle), pct(idle, 99)
    return {
        **got,
        "p0_idle_p50_s": idle50,
        "p0_idle_p99_s": idle99,
        "p0_count": len(p0_all),
        "p0_ok": len(p0),
        "p0_p50_s": statistics.median(p0) if p0 else None,
        "p0_p99_s": pct(p0, 99) if p0 else None,
        "p0_p50_ratio": statistics.median(p0) / idle50 if p0 else None,
        "p0_p99_ratio": pct(p0, 99) / idle99 if p0 else None,
        "p3_count": len(p3),
        "p3_served": len(p3) - len(shed),
        "p3_shed": len(shed),
        "p3_shed_share": len(shed) / len(p3) if p3 else 0.0,
        "shed_by": dict(by),
        "shed_with_retry_after": len(retry),
        "retry_after_p50_s": statistics.median(retry) if retry else None,
        "retry_after_max_s": max(retry) if retry else None,
        "p3_served_latency_p99_s": pct([o.latency_s for o in p3 if o.status == 200], 99)
        if len(p3) > len(shed)
        else None,
        "client_failures": dict(run.failures),
    }


def report(r: dict[str, Any], console: Console) -> None:
    t = Table(title="overload: the default configuration at 10× capacity")
    t.add_column("figure")
    t.add_column("value", justify="right")

    def row(name: str, value: str) -> None:
        t.add_row(name, value)

    row("offered", f"{r['offered_per_s']:.0f} req/s for {r['send_s']:.0f} s ({r['sent']} requests)")
    row("P0 served", f"{r['p0_ok']} of {r['p0_count']}")
    row(
        "P0 p50 / p99 latency, idle",
        f"{r['p0_idle_p50_s'] * 1000:.0f} / {r['p0_idle_p99_s'] * 1000:.0f} ms",
    )
    if r["p0_p50_s"] is not None:
        row(
            "P0 p50 / p99 latency, flood",
            f"{r['p0_p50_s'] * 1000:.0f} / {r['p0_p99_s'] * 1000:.0f} ms "
            f"({r['p0_p50_ratio']:.2f}× / {r['p0_p99_ratio']:.2f}× idle)",
        )
    row("P3 shed", f"{r['p3_shed']} of {r['p3_count']} ({r['p3_shed_share']:.1%})")
    for k, v in sorted(r["shed_by"].items()):
        row(f"  as {k}", str(v))
    if r["retry_after_p50_s"] is not None:
        row(
            "  with Retry-After",
            f"{r['shed_with_retry_after']} (p50 {r['retry_after_p50_s']} s, max {r['retry_after_max_s']} s)",
        )
    if r["p3_served_latency_p99_s"] is not None:
        row("P3 served, latency p99", f"{r['p3_served_latency_p99_s']:.1f} s")
    row(
        "RSS before / peak / after",
        f"{r['rss_before_mb']:.0f} / {r['rss_peak_mb']:.0f} / {r['rss_after_mb']:.0f} MB",
    )
    row("recovery (flood end → every accepted request answered)", f"{r['recovery_s']:.1f} s")
    row("P0 p50 after recovery", f"{r['p0_after_p50_s'] * 1000:.0f} ms")
    row("client-side failures", ", ".join(f"{k} {v}" for k, v in r["client_failures"].items()) or "none")
    console.print(t)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--service-s", type=float, default=0.5, help="each request's time on a slot")
    p.add_argument("--tokens", type=int, default=50, help="max_tokens of each request")
    p.add_argument("--overload", type=float, default=10.0, help="offered load ÷ capacity")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of flood")
    p.add_argument("--p0-share", type=float, default=0.5, help="P0's arrival rate ÷ capacity")
    p.add_argument("--idle", type=int, default=20, help="idle P0 requests for the reference")
    p.add_argument("--json", type=Path, metavar="FILE")
    args = p.parse_args(argv)
    with server(args.slots, args.service_s, args.tokens) as s:
        idle = asyncio.run(idle_p0(s.port, args.tokens, args.idle))
        got = asyncio.run(flood(s, args))
    result = summarize(idle, got)
    report(result, Console())
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
