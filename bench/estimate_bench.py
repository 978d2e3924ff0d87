"""How right laneway's wait estimates are on a live server, with short and long
requests interleaved.

    python bench/estimate_bench.py [--slots 4] [--ms-per-token 20] [--duration 60]
        [--load 1.3] [--long-share 0.3] [--seed 0] [--json out.json]

One ``laneway serve`` on 127.0.0.1 in front of the stand-in engine
(``python -m laneway.standin``, ``--slots`` sequences at a time, a token each
``--ms-per-token``). First a history of short requests only (what fooled the
estimates before: long work sized by short history); then, for ``--duration``
s, open-loop arrivals at ``--load`` x capacity: P2 requests of which
``--long-share`` are long (400 tokens) and the rest short (10 tokens), sent in
random order, P3 long ones beside them, and P0 short ones a few a minute.

For every request, the estimate (and its interval) is what ``GET /v1/queue/estimate`` says for its
class and model just before it is sent (the wait a new arrival faces, as the
server's admission sees it), and its wait is the time to its first token less
the engine's one token step. Reported per class, among the requests that
waited at least 1 s: the median and p90 of |estimate - wait| / wait, and the
same over every request with max(wait, 1 s) below the line (the older figure,
which requests that never waited flatter).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from gateway_bench import pct
from laneway.testing import ServeProcess, standin_process

HOST = "127.0.0.1"
SHORT, LONG = 10, 400  # tokens
err = Console(stderr=True)


def config(data: Path, url: str, slots: int) -> str:
    return (
        f'[server]\nhost = "{HOST}"\ndata_dir = "{data}"\n\n'
        f'[[workers]]\nname = "up0"\ntype = "upstream"\nurl = "{url}"\nmodel = "standin"\n'
        f'served_name = "m"\nslots = {slots}\ntoken_ids = "none"\n'
    )


async def one(
    c: httpx.AsyncClient, base: str, cls: str, tokens: int, step_s: float, out: list[dict[str, Any]]
) -> None:
    est = (await c.get(base + "/queue/estimate", params={"priority": cls, "model": "m"})).json()
    body = {"model": "m", "prompt": f"{cls} {tokens}", "max_tokens": tokens, "priority": cls, "stream": True}
    t0 = time.monotonic()
    first = None
    status = 0
    async with c.stream("POST", base + "/completions", json=body) as r:
        status = r.status_code
        async for line in r.aiter_lines():
            if first is None and line.startswith("data: {"):
                first = time.monotonic()
    if status != 200 or first is None:
        out.append({"class": cls, "tokens": tokens, "status": status, "t": t0})
        return
    wait = max(0.0, first - t0 - step_s)
    row = {"class": cls, "tokens": tokens, "status": status, "t": t0}
    low, high = est.get("estimated_wait_range_s") or (None, None)
    out.append(
        {
            **row,
            "estimate": est["estimated_wait_s"],
            "low": low,
            "high": high,
            "basis": est.get("basis"),
            "wait": wait,
        }
    )


async def drive(base: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    step_s = args.ms_per_token / 1000.0
    rng = random.Random(args.seed)
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    results: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=900, limits=limits) as c:
        history: list[dict[str, Any]] = []
        for _ in range(3 * args.slots):  # what the server has seen: short requests only
            await one(c, base, "P2", SHORT, step_s, history)
        mean_tokens = args.long_share * LONG + (1 - args.long_share) * SHORT
        p2_rate = args.load * args.slots / (mean_tokens * step_s) * 0.8  # P3 takes the rest
        p3_rate = args.load * args.slots / (LONG * step_s) * 0.2
        tasks: list[asyncio.Task[None]] = []
        t_end = time.monotonic() + args.duration
        next_at = {"P2": time.monotonic(), "P3": time.monotonic() + 1.0, "P0": time.monotonic() + 2.0}
        rates = {"P2": p2_rate, "P3": p3_rate, "P0": 4 / 60.0}
        sent = 0
        while time.monotonic() < t_end and sent < 5000:
            cls = min(next_at, key=next_at.__getitem__)
            delay = next_at[cls] - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if cls == "P2":
                tokens = LONG if rng.random() < args.long_share else SHORT
            elif cls == "P3":
                tokens = LONG
            else:
                tokens = SHORT
            tasks.append(asyncio.create_task(one(c, base, cls, tokens, step_s, results)))
            sent += 1
            next_at[cls] += rng.expovariate(rates[cls])
        err.print(f"[dim]{sent} requests sent; waiting for the last of them…[/]")
        await asyncio.gather(*tasks)
    return results


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in rows if r["status"] == 200 and r.get("estimate") is not None]
    waited = [abs(r["estimate"] - r["wait"]) / r["wait"] for r in done if r["wait"] >= 1.0]
    every = [abs(r["estimate"] - r["wait"]) / max(r["wait"], 1.0) for r in done]
    bounded = [r for r in done if r.get("low") is not None and r.get("high") is not None]
    inside = [r for r in bounded if r["low"] - 1e-3 <= r["wait"] <= r["high"] + 1e-3]
    return {
        "requests": len(rows),
        "answered": len(done),
        "in_interval": len(inside) / len(bounded) if bounded else None,
        "bounded": len(bounded),
        "not_known": sum(1 for r in done if r.get("high") is None),
        "waited": len(waited),
        "median": statistics.median(waited) if waited else None,
        "p90": pct(waited, 90) if waited else None,
        "old_median": statistics.median(every) if every else None,
        "wait_p50_s": statistics.median([r["wait"] for r in done]) if done else None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="estimate-bench-") as tmp:
        d = Path(tmp)
        with standin_process(
            d / "standin.log", "--slots", str(args.slots), "--ms-per-token", str(args.ms_per_token)
        ) as engine:
            cfg = d / "laneway.toml"
            cfg.write_text(config(d / "data", engine.url, args.slots))
            server = ServeProcess(["--config", str(cfg)], d / "laneway.log")
            try:
                err.print(
                    f"[dim]history of short requests, then {args.duration:g} s at {args.load:g}x capacity…[/]"
                )
                rows = asyncio.run(drive(server.url + "/v1", args))
            finally:
                server.stop()
    by_class = {cls: figures([r for r in rows if r["class"] == cls]) for cls in ("P0", "P2", "P3")}
    by_size = {
        f"P2 {name}": figures([r for r in rows if r["class"] == "P2" and r["tokens"] == n])
        for name, n in (("short", SHORT), ("long", LONG))
    }
    return {"classes": by_class, "sizes": by_size, "all": figures(rows), "args": vars(args), "rows": rows}


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def report(r: dict[str, Any], console: Console) -> None:
    t = Table(title="Wait estimates on a live server (short and long requests interleaved)")
    cols = ("class", "answered", "waited ≥ 1 s", "error median", "p90", "old figure", "wait p50 s",
            "in interval", "not known")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="left" if col == "class" else "right")
    for name, f in [*r["classes"].items(), *r["sizes"].items(), ("all", r["all"])]:
        inside = "-" if f["in_interval"] is None else f"{f['in_interval']:.0%} of {f['bounded']}"
        t.add_row(
            name, str(f["answered"]), str(f["waited"]), fmt(f["median"]), fmt(f["p90"]), fmt(f["old_median"]),
            fmt(f["wait_p50_s"]), inside, str(f["not_known"]),
        )  # fmt: skip
    console.print(t)
    console.print(
        "error: |estimate - wait| / wait over the requests that waited ≥ 1 s; old figure: the "
        "median over all of them, with max(wait, 1 s) below the line; in interval: the share of "
        "waits inside the interval the endpoint announced (estimated_wait_range_s, aimed at the "
        "10th-90th percentile: 80 %), of those it gave a bound; not known: answers with no bound."
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--ms-per-token", type=float, default=20.0)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals after the history")
    p.add_argument("--load", type=float, default=1.3, help="offered load, x capacity")
    p.add_argument("--long-share", type=float, default=0.3, help="share of P2 requests that are long")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    result = run(args)
    report(result, Console())
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
