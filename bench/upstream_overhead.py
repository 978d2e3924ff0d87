"""The overhead part of ``bench/upstream_bench.py`` (``--only overhead``): 1-token requests
sent straight to the stand-in engine and through laneway in turn, on three paths, then
laneway's requests a second; and the configuration of laneway with one upstream worker
that the bench's parts share (:func:`gateway_toml`)."""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gateway_bench import Connection, _load, _run_fast, added, post_bytes, wrk
from laneway.testing import serve_process, standin_process

HOST = "127.0.0.1"
err = Console(stderr=True)


def gateway_toml(
    data: Path, url: str, model: str, slots: int, worker: str = "", traces: str | None = None
) -> str:
    traced = f'otlp_traces_endpoint = "{traces}"\n' if traces else ""
    return (
        f'[server]\nhost = "{HOST}"\ndata_dir = "{data}"\n{traced}\n'
        f'[[workers]]\nname = "up0"\ntype = "upstream"\nurl = "{url}"\nmodel = "{model}"\n'
        f'served_name = "{model}"\nslots = {slots}\n{worker}'
    )


# --------------------------------------------------------------------------- 2. the overhead
# what each path of the overhead sends: its endpoint and body (1 token, answered at once)
OVERHEAD_PATHS: dict[str, tuple[str, dict[str, Any]]] = {
    "completions": ("/v1/completions", {"model": "standin", "prompt": "hello", "max_tokens": 1}),
    "chat": (
        "/v1/chat/completions",
        {"model": "standin", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 1},
    ),
    "chat, streamed": (
        "/v1/chat/completions",
        {
            "model": "standin",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 1,
            "stream": True,
        },
    ),
}


async def added_latency(direct_port: int, via_port: int, raw: bytes, requests: int) -> dict[str, Any]:
    """``requests`` of ``raw``, each sent directly and through laneway in turn (whole answers,
    streams read to their end)."""
    a, b = await Connection.open(direct_port), await Connection.open(via_port)
    direct, via = [], []
    try:
        for i in range(requests + 100):
            for conn, into in ((a, direct), (b, via)):
                t0 = time.perf_counter()
                status, body = await conn.request(raw)
                if status != 200:
                    raise RuntimeError(f"HTTP {status}: {body[:300]!r}")
                if i >= 100:  # after a warm-up
                    into.append(time.perf_counter() - t0)
    finally:
        await a.close()
        await b.close()
    return added(direct, via, "laneway")


def throughput(
    url: str, port: int, path: str, body: dict[str, Any], cpu_s: Any, args: argparse.Namespace
) -> dict[str, Any]:
    if shutil.which("wrk") is not None:
        target = url.removesuffix("/v1") + path
        r = wrk(target, json.dumps(body).encode(), args.clients, args.duration, cpu_s, args.wrk_threads)
        r["loadgen"] = "wrk"
        return r
    raw = post_bytes(path, body)
    cpu0 = cpu_s()
    r = _run_fast(_load(port, raw, args.clients, 1.0, args.duration))
    r.update(seconds=args.duration, req_per_s=r["requests"] / args.duration, server_cpu_s=cpu_s() - cpu0)
    r["loadgen"] = "python"
    return r


class TraceSink:
    """An OTLP/HTTP endpoint on 127.0.0.1 that takes laneway's spans and counts the posts
    (what a collector would do first; the spans are not decoded)."""

    def __init__(self) -> None:
        self.spans = 0  # posts received
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                sink.spans += 1
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
        self.url = f"http://{HOST}:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()


@contextlib.contextmanager
def trace_sink() -> Iterator[TraceSink]:
    sink = TraceSink()
    try:
        yield sink
    finally:
        sink.server.shutdown()
        sink.server.server_close()


@contextlib.contextmanager
def on_cores(cpus: set[int]) -> Iterator[None]:
    """The processes started in the block run on ``cpus`` from their start."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def bench_overhead(args: argparse.Namespace) -> dict[str, Any]:
    err.print(
        f"[dim]overhead: {args.requests} pairs a path, then {args.clients} clients for {args.duration} s…[/]"
    )
    cores = sorted(os.sched_getaffinity(0))
    # laneway alone on the last core; the engine and the clients on the others
    gw_core, rest = ({cores[-1]}, set(cores[:-1])) if len(cores) > 1 else (set(cores), set(cores))
    out: dict[str, Any] = {"paths": {}, "laneway_cores": sorted(gw_core), "clients": args.clients}
    with tempfile.TemporaryDirectory(prefix="upstream-bench-over-") as tmp:
        d = Path(tmp)
        mine = os.sched_getaffinity(0)
        os.sched_setaffinity(0, rest)  # (the processes started now inherit it)
        try:
            with (
                standin_process(d / "standin.log", "--slots", "64", "--ms-per-token", "0") as engine,
                trace_sink() as sink,
            ):
                # laneway as configured by default (no traces), then sending a trace per request
                for traces in (None, sink.url) if args.traces else (None,):
                    cfg = d / "laneway.toml"
                    cfg.write_text(gateway_toml(d / "data", engine.url, "standin", 64, traces=traces))
                    with contextlib.ExitStack() as stack:
                        # laneway started on its core: one moved there once started ran ~30 %
                        # fewer requests a second here (2,800 vs 1,900 req/s, chat), not CPU-bound
                        with on_cores(gw_core):
                            server = stack.enter_context(
                                serve_process("--config", str(cfg), log=d / "laneway.log")
                            )
                        for name, (path, body) in OVERHEAD_PATHS.items():
                            name += ", traced" if traces else ""
                            err.print(f"[dim]  {name}…[/]")
                            raw = post_bytes(path, body)
                            lat = _run_fast(added_latency(engine.port, server.port, raw, args.requests))
                            via = throughput(server.url + "/v1", server.port, path, body, server.cpu_s, args)
                            via["server_cpu_us_per_req"] = via["server_cpu_s"] / max(1, via["requests"]) * 1e6
                            direct = throughput(engine.url, engine.port, path, body, engine.cpu_s, args)
                            out["paths"][name] = {"latency": lat, "laneway": via, "direct": direct}
                out["spans_received"] = sink.spans
        finally:
            os.sched_setaffinity(0, mine)
    return out


def overhead_table(o: dict[str, Any]) -> Table:
    """The overhead's results as a table."""
    t = Table(title="1-token requests: laneway in front of the stand-in vs the stand-in alone")
    for c in ("path", "direct p50", "direct p99", "laneway p50", "laneway p99", "added p50 ms",
              "added p99 ms", "laneway req/s", "direct req/s", "laneway CPU µs/req", "load"):  # fmt: skip
        t.add_column(c, justify="right")
    for name, p in o["paths"].items():
        lat = p["latency"]
        t.add_row(
            name,
            f"{lat['direct_p50_ms']:.3f}",
            f"{lat['direct_p99_ms']:.3f}",
            f"{lat['laneway_p50_ms']:.3f}",
            f"{lat['laneway_p99_ms']:.3f}",
            f"{lat['added_p50_ms']:.3f}",
            f"{lat['added_p99_ms']:.3f}",
            f"{p['laneway']['req_per_s']:.0f}",
            f"{p['direct']['req_per_s']:.0f}",
            f"{p['laneway']['server_cpu_us_per_req']:.0f}",
            p["laneway"]["loadgen"],
        )
    t.caption = (
        f"laneway pinned to core {o['laneway_cores']}, the engine and the clients on the others; "
        f"targets: added p50 ≤ 1 ms, laneway ≥ 2,000 req/s ({o['clients']} clients)"
    )
    return t
