"""laneway as one process, as one replica with Redis, and as three replicas, on the same
stand-in engine: requests/s, latency under load, added latency, CPU per request.

    python bench/replica_bench.py [--only load,flood] [--requests 1000] [--clients 32] [--duration 5]
        [--batch 100] [--tokens 500] [--urgent 10] [--json out.json]

Every process runs on 127.0.0.1 and is stopped afterwards; the stand-in engine
(``python -m laneway.standin``, 64 slots, answering at once) is what every
setup sends to, so the engine is never the bottleneck:

1. **one process**: ``laneway serve`` alone (no ``[cluster]``, no Redis);
2. **1 replica**: the same with ``[cluster]``: it leads (the 1-token requests
   start on slots it lends itself, see ``laneway.cluster.lending``);
3. **3 replicas**: three ``laneway serve`` with ``[cluster]``, one leading;
4. the same with nothing lent (``lend_max_s = 0``): every request's events and
   decisions go through Redis and the leader, as requests too long to start on a
   lent slot do;
5. three replicas and a fourth set apart for scheduling (``leader_priority``).

For each: added latency of 1-token completions sent one at a time (through
laneway vs to the stand-in directly, in turn on kept-alive connections; with
3 replicas, through the leader and through a replica that does not lead),
then requests/s with ``--clients`` connections for ``--duration`` s (``wrk``,
or a small asyncio client without it; with 3 replicas, the clients are split
over them), and the CPU seconds per request of the laneway processes and of
Redis. On a machine with fewer cores than processes the replicas share the
cores, so requests/s cannot grow with them; the CPU per request says what
they would do with a core each (see the note in the report).

In turn: with several replicas, the same clients on each replica alone as well,
which measures what each process spends per request without the crowding of
every process busy at once on few cores.

Then (``flood``) P0 under a P3 flood on a 4-slot stand-in (2 ms a token), one
process vs three replicas: P0 one a second (streamed, on a replica that does
not lead), the flood spread over the three; the ratio to idle.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import itertools
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
from redis import Redis
from rich.console import Console
from rich.table import Table

from chat_stream import urgent
from gateway_bench import _load, _run_fast, post_bytes, wrk
from laneway.testing import RedisProcess, ServeProcess, standin_process
from upstream_bench import chat
from upstream_overhead import added_latency

HOST = "127.0.0.1"
err = Console(stderr=True)
BODY = {"model": "standin", "prompt": "hello", "max_tokens": 1}


def cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, in clock ticks of 10 ms


def toml(data: Path, url: str, cluster: str = "") -> str:
    return (
        f'[server]\nhost = "{HOST}"\ndata_dir = "{data}"\n{cluster}\n'
        f'[[workers]]\nname = "up0"\ntype = "upstream"\nurl = "{url}"\nmodel = "standin"\n'
        'served_name = "standin"\nslots = 64\n'
    )


@contextmanager
def laneways(
    tmp: Path,
    url: str,
    n: int,
    redis_url: str | None,
    tag: str,
    make: Any = None,
    *,
    scheduler: bool = False,
    lend: bool = True,
) -> Iterator[list[ServeProcess]]:
    """``n`` laneway processes (replicas of one cluster with ``redis_url``); with
    ``scheduler``, one more, last, set apart for scheduling (``leader_priority = 2``: it
    leads once it runs; the caller sends it no clients); without ``lend``, every request
    goes through the leader (``lend_max_s = 0``)."""
    prefix = f"bench{uuid.uuid4().hex[:6]}:"
    tmp = tmp / tag
    tmp.mkdir()
    with ExitStack() as stack:
        procs = []
        for i in range(n + scheduler):
            cluster = ""
            if redis_url is not None:
                cluster = f'[cluster]\nredis_url = "{redis_url}"\nreplica = "r{i}"\nkey_prefix = "{prefix}"\n'
                if i == n:
                    cluster += "leader_priority = 2\n"
                if not lend:
                    cluster += "lend_max_s = 0\n"
            cfg = tmp / f"r{i}.toml"
            cfg.write_text((make or toml)(tmp / f"data{i}", url, cluster))
            p = ServeProcess(["--config", str(cfg)], tmp / f"r{i}.log")
            stack.callback(p.stop)
            procs.append(p)
        if scheduler:
            assert redis_url is not None
            wait_for_leader(redis_url, prefix, f"r{n}")
        yield procs


def wait_for_leader(redis_url: str, prefix: str, replica: str, timeout_s: float = 15.0) -> None:
    client = Redis.from_url(redis_url)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            raw = client.get(prefix + "leader")
            if raw is not None and raw.decode().rpartition("|")[0] == replica:
                return
            time.sleep(0.1)
        raise RuntimeError(f"replica {replica} did not take the lease in {timeout_s:g} s")
    finally:
        client.close()


def load(procs: list[ServeProcess], args: argparse.Namespace) -> dict[str, Any]:
    """``args.clients`` connections split over ``procs`` for ``args.duration`` s."""
    share = max(1, args.clients // len(procs))
    body = json.dumps(BODY).encode()

    def one(p: ServeProcess) -> dict[str, Any]:
        if shutil.which("wrk") is not None:
            return wrk(p.url + "/v1/completions", body, share, args.duration, lambda: 0.0)
        r = _run_fast(_load(p.port, post_bytes("/v1/completions", BODY), share, 1.0, args.duration))
        r["req_per_s"] = r["requests"] / args.duration
        return r

    with concurrent.futures.ThreadPoolExecutor(len(procs)) as pool:
        parts = list(pool.map(one, procs))
    return {
        "req_per_s": sum(r["req_per_s"] for r in parts),
        "requests": sum(r["requests"] for r in parts),
        "errors": sum(r["errors"] for r in parts),
        "latency_p50_ms": max(r["latency_p50_ms"] for r in parts),
        "latency_p99_ms": max(r["latency_p99_ms"] for r in parts),
        "loadgen": "wrk" if shutil.which("wrk") else "python",
    }


def measure(
    name: str,
    procs: list[ServeProcess],
    engine_port: int,
    redis_pid: int | None,
    args: argparse.Namespace,
    *,
    scheduler: ServeProcess | None = None,
) -> dict[str, Any]:
    """Added latency and load through ``procs``; CPU of them (and of ``scheduler``, a
    replica leading that clients are not sent to)."""
    err.print(f"[dim]{name}: added latency ({args.requests} pairs), then {args.clients} clients…[/]")
    lat = {}
    if scheduler is not None:
        lat["replica"] = _run_fast(added_latency(engine_port, procs[0].port, args.requests))
    elif len(procs) > 1:  # the first one started leads (it took the lease first); another does not
        lat["leader"] = _run_fast(added_latency(engine_port, procs[0].port, args.requests))
        lat["follower"] = _run_fast(added_latency(engine_port, procs[-1].port, args.requests))
    else:
        lat["laneway"] = _run_fast(added_latency(engine_port, procs[0].port, args.requests))
    every = [*procs, *([scheduler] if scheduler is not None else [])]
    cpu0 = [cpu_of(p.proc.pid) for p in every]
    rcpu0 = cpu_of(redis_pid) if redis_pid else 0.0
    thr = load(procs, args)
    cpu = [cpu_of(p.proc.pid) - c for p, c in zip(every, cpu0, strict=True)]
    rcpu = (cpu_of(redis_pid) - rcpu0) if redis_pid else 0.0
    n = max(1, thr["requests"])
    thr["laneway_cpu_us_per_req"] = [c / n * 1e6 for c in cpu]
    thr["redis_cpu_us_per_req"] = rcpu / n * 1e6
    # with a core for each process (and one for Redis): the busiest one bounds the rate
    busiest = max([*thr["laneway_cpu_us_per_req"], thr["redis_cpu_us_per_req"]])
    thr["req_per_s_a_core_each"] = 1e6 / busiest if busiest > 0 else float("nan")
    if len(procs) > 1:
        thr["in_turn"] = in_turn(procs, every, redis_pid, args)
    return {"latency": lat, "load": thr}


def in_turn(
    procs: list[ServeProcess], every: list[ServeProcess], redis_pid: int | None, args: argparse.Namespace
) -> dict[str, Any]:
    """The same clients on one replica at a time (the others idle, as the cluster they are):
    the CPU every process spends per request sent to each replica, without the crowding of
    every process busy at once on this machine's few cores. With the load spread evenly, each
    process spends the mean of those per request; the busiest bounds the rate, a core each."""
    per: list[list[float]] = []  # [client-facing replica][process] -> µs per request
    rper: list[float] = []
    for p in procs:
        cpu0 = [cpu_of(q.proc.pid) for q in every]
        rcpu0 = cpu_of(redis_pid) if redis_pid else 0.0
        thr = load([p], args)
        n = max(1, thr["requests"])
        per.append([(cpu_of(q.proc.pid) - c) / n * 1e6 for q, c in zip(every, cpu0, strict=True)])
        rper.append(((cpu_of(redis_pid) - rcpu0) if redis_pid else 0.0) / n * 1e6)
    spread = [sum(row[j] for row in per) / len(per) for j in range(len(every))]
    redis = sum(rper) / len(rper)
    busiest = max([*spread, redis])
    return {
        "laneway_cpu_us_per_req": spread,
        "redis_cpu_us_per_req": redis,
        "req_per_s_a_core_each": 1e6 / busiest if busiest > 0 else float("nan"),
    }


async def flood(batch_urls: list[str], urgent_url: str, args: argparse.Namespace) -> dict[str, Any]:
    """P0 requests (streamed) one a second on ``urgent_url``, idle and then while ``--batch``
    P3 requests of ``--tokens`` sent round-robin to ``batch_urls`` run."""
    limits = httpx.Limits(max_connections=args.batch + 16, max_keepalive_connections=args.batch + 16)
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:
        hot = chat("standin", 16, "hotfix, are you there?", "P0", True)
        for _ in range(3):
            await urgent(client, urgent_url, hot)
        idle = [await urgent(client, urgent_url, hot) for _ in range(args.urgent)]
        jobs = [
            asyncio.create_task(
                client.post(
                    u + "/chat/completions", json=chat("standin", args.tokens, f"job {i}", "P3", False)
                )
            )
            for i, u in zip(range(args.batch), itertools.cycle(batch_urls), strict=False)
        ]
        await asyncio.sleep(1.0)
        loaded = []
        for _ in range(args.urgent):
            if all(j.done() for j in jobs):
                break
            loaded.append(await urgent(client, urgent_url, hot))
            await asyncio.sleep(max(0.0, 1.0 - loaded[-1][1]))
        done = await asyncio.gather(*jobs)
    bad = sum(1 for r in done if r.status_code != 200)
    kinds: dict[str, int] = {}
    for r in done:
        if r.status_code != 200:
            try:
                code = (r.json().get("error") or {}).get("code")
            except ValueError:
                code = None
            kinds[f"{r.status_code} {code}"] = kinds.get(f"{r.status_code} {code}", 0) + 1
    idle_ms = statistics.median(x[1] for x in idle) * 1e3
    flood_ms = statistics.median(x[1] for x in loaded) * 1e3 if loaded else float("nan")
    return {
        "idle_p50_ms": idle_ms,
        "flood_p50_ms": flood_ms,
        "ratio": flood_ms / idle_ms,
        "batch_errors": bad,
        "batch_error_kinds": kinds,
    }


def toml_4_slots(data: Path, url: str, cluster: str = "") -> str:
    return toml(data, url, cluster).replace("slots = 64", "slots = 4")


def floods(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="replica-bench-flood-") as d:
        tmp = Path(d)
        with standin_process(tmp / "standin.log", "--slots", "4", "--ms-per-token", "2") as engine:
            with laneways(tmp, engine.url, 1, None, "one", toml_4_slots) as procs:
                err.print(f"[dim]flood, one process: {args.batch} × {args.tokens} tokens…[/]")
                out["one process"] = _run_fast(flood([procs[0].url + "/v1"], procs[0].url + "/v1", args))
            redis = RedisProcess(tmp / "redis")
            try:
                with laneways(tmp, engine.url, 3, redis.url, "three", toml_4_slots) as procs:
                    err.print(f"[dim]flood, 3 replicas: {args.batch} × {args.tokens} tokens…[/]")
                    urls = [p.url + "/v1" for p in procs]
                    out["3 replicas + Redis"] = _run_fast(flood(urls, urls[-1], args))
            finally:
                redis.stop()
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="replica-bench-") as d:
        tmp = Path(d)
        with standin_process(tmp / "standin.log", "--slots", "64", "--ms-per-token", "0") as engine:
            with laneways(tmp, engine.url, 1, None, "one") as procs:
                out["one process"] = measure("one process", procs, engine.port, None, args)
            redis = RedisProcess(tmp / "redis")
            try:
                with laneways(tmp, engine.url, 1, redis.url, "single") as procs:
                    out["1 replica + Redis"] = measure("1 replica", procs, engine.port, redis.proc.pid, args)
                with laneways(tmp, engine.url, 3, redis.url, "three") as procs:
                    out["3 replicas + Redis"] = measure(
                        "3 replicas", procs, engine.port, redis.proc.pid, args
                    )
                with laneways(tmp, engine.url, 3, redis.url, "three-nl", lend=False) as procs:
                    out["3 replicas + Redis, nothing lent"] = measure(
                        "3 replicas, nothing lent", procs, engine.port, redis.proc.pid, args
                    )
                with laneways(tmp, engine.url, 3, redis.url, "three-s", scheduler=True) as procs:
                    out["3 replicas + scheduler + Redis"] = measure(
                        "3 replicas and a scheduling one",
                        procs[:3],
                        engine.port,
                        redis.proc.pid,
                        args,
                        scheduler=procs[3],
                    )
            finally:
                redis.stop()
            # the machine's pace drifts (other work on the host): one process again, at the
            # end, and the ratios against both
            with laneways(tmp, engine.url, 1, None, "one-again") as procs:
                out["one process, again"] = measure("one process, again", procs, engine.port, None, args)
    return out


def baseline(r: dict[str, Any]) -> float | None:
    """Requests/s of one process with a core: from its mean CPU per request over both runs."""
    cpu = [r[k]["load"]["laneway_cpu_us_per_req"][0] for k in ("one process", "one process, again") if k in r]
    return 1e6 / (sum(cpu) / len(cpu)) if cpu else None


def report(r: dict[str, Any], console: Console) -> None:
    t = Table(title="one process vs replicas on Redis (stand-in engine, 1-token completions)")
    cols = ("setup", "req/s", "p50 / p99 under load", "added p50 / p99 (one at a time)", "CPU µs/req")
    for col in (*cols, "req/s, a core each"):
        t.add_column(col, justify="right" if col != "setup" else "left")
    base = baseline(r)
    for name, m in r.items():
        load_ = m["load"]
        lat = "; ".join(
            f"{who} {v['added_p50_ms']:.2f} / {v['added_p99_ms']:.2f} ms" for who, v in m["latency"].items()
        )
        cpu = " + ".join(f"{c:.0f}" for c in load_["laneway_cpu_us_per_req"])
        if load_["redis_cpu_us_per_req"]:
            cpu += f" (Redis {load_['redis_cpu_us_per_req']:.0f})"
        t.add_row(
            name,
            f"{load_['req_per_s']:,.0f}",
            f"{load_['latency_p50_ms']:.1f} / {load_['latency_p99_ms']:.1f} ms",
            lat,
            cpu,
            f"{load_['req_per_s_a_core_each']:,.0f}"
            + (f" ({load_['req_per_s_a_core_each'] / base:.2f}×)" if base and "one" not in name else "")
            + (
                f"; in turn {load_['in_turn']['req_per_s_a_core_each']:,.0f}"
                f" ({load_['in_turn']['req_per_s_a_core_each'] / base:.2f}×)"
                if base and "in_turn" in load_
                else ""
            ),
        )
    console.print(t)
    console.print(
        "req/s, a core each: 10⁶ ÷ the CPU µs per request of the busiest process (laneway or "
        "Redis), what the setup does with a core for every process; the ratios are to one "
        "process's mean over its two runs (first and last: the host's pace drifts). In turn: "
        "the clients on one replica at a time, the CPU per request each process spends, "
        "averaged as if the load were spread (no crowding of busy processes on few cores). "
        "The req/s column is measured on this machine's cores, which the processes share."
    )


def flood_report(r: dict[str, Any], console: Console) -> None:
    t = Table(title="P0 (streamed, 16 tokens) under a P3 flood on a 4-slot stand-in, ÷ idle")
    for col in ("setup", "P0 idle p50", "P0 under the flood p50", "ratio", "flood errors"):
        t.add_column(col, justify="right" if col != "setup" else "left")
    for name, m in r.items():
        t.add_row(
            name,
            f"{m['idle_p50_ms']:.1f} ms",
            f"{m['flood_p50_ms']:.1f} ms",
            f"{m['ratio']:.2f}×",
            ", ".join(f"{n} {k}" for k, n in m["batch_error_kinds"].items()) or "0",
        )
    console.print(t)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=1000, help="pairs for the added latency")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--json", type=Path, metavar="FILE")
    p.add_argument("--batch", type=int, default=100, help="P3 requests of the flood")
    p.add_argument("--tokens", type=int, default=500, help="tokens of each")
    p.add_argument("--urgent", type=int, default=10, help="P0 requests, idle and under the flood")
    p.add_argument("--only", default="load,flood", help="load, flood or both")
    args = p.parse_args(argv)
    result: dict[str, Any] = {}
    if "load" in args.only:
        result["load"] = run(args)
        report(result["load"], Console())
    if "flood" in args.only:
        result["flood"] = floods(args)
        flood_report(result["flood"], Console())
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
