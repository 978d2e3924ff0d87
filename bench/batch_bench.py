"""Batch throughput through the built-in engine, chat latency beside it, and the store's cost.

One ``laneway serve --model builtin:tiny`` subprocess (a fresh data directory)
serves three phases in one run:

1. idle: sequential P0 chat requests (the latency baseline);
2. batch alone: a batch of ``--lines`` chat lines (``--max-tokens`` each,
   ``ignore_eos`` so every line does the same work) at P2: lines/s from
   creation to ``completed``;
3. batch + chat: the same batch again while ``--chat-clients`` clients send
   P0 chat requests back to back: lines/s, and the P0 latency under the batch.

Then the store alone (no server): the time per line of each store operation
of a batch's life (insert on validation, claim in groups, finish with a
realistic result line, finalize into the output file), on the synchronous
SQLite store and through the async wrapper (one thread hop per call).

    python bench/batch_bench.py [--lines 200] [--max-tokens 8] [--slots 4] [--chat-clients 2]
        [--store-lines 20000] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import openai
from rich.console import Console
from rich.table import Table

from laneway.store import BatchRecord, BatchStatus, NewLine, Outputs, SQLiteDB, SQLiteStore
from laneway.testing import ServeProcess

MODEL = "builtin:tiny"


# ---------------------------------------------------------------------- the server
def start_server(data: Path, slots: int) -> ServeProcess:
    data.mkdir(parents=True, exist_ok=True)
    args = ["--model", MODEL, "--slots", str(slots), "--data-dir", str(data / "state")]
    return ServeProcess(args, data / "server.log")


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="bench", max_retries=0, timeout=120)


def chat_once(c: openai.OpenAI, max_tokens: int) -> float:
    t0 = time.perf_counter()
    c.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "How is the queue today?"}],
        max_tokens=max_tokens,
        extra_body={"priority": "P0", "ignore_eos": True},
    )
    return time.perf_counter() - t0


def run_batch(c: openai.OpenAI, lines: int, max_tokens: int) -> tuple[float, int]:
    body = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Summarise item {i}."}],
                "max_tokens": max_tokens,
                "ignore_eos": True,
            },
        }
        for i in range(lines)
    ]
    data = "".join(json.dumps(x) + "\n" for x in body).encode()
    f = c.files.create(file=("bench.jsonl", data), purpose="batch")
    t0 = time.perf_counter()
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    while b.status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.02)
        b = c.batches.retrieve(b.id)
    elapsed = time.perf_counter() - t0
    if b.status != "completed":
        raise SystemExit(f"the bench batch ended {b.status}: {b.errors}")
    return elapsed, b.request_counts.completed


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def latency(xs: list[float]) -> dict[str, float]:
    return {
        "count": len(xs),
        "p50_ms": round(statistics.median(xs) * 1000, 1),
        "p95_ms": round(pct(xs, 0.95) * 1000, 1),
        "max_ms": round(max(xs) * 1000, 1),
    }


def bench_server(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    server = start_server(root / "serve", args.slots)
    try:
        c = client(server.url)
        for _ in range(3):  # warm-up
            chat_once(c, args.max_tokens)
        idle = [chat_once(c, args.max_tokens) for _ in range(args.chat_samples)]
        alone_s, alone_n = run_batch(c, args.lines, args.max_tokens)

        stop = threading.Event()
        under: list[float] = []

        def chatter() -> None:
            cc = client(server.url)
            while not stop.is_set():
                under.append(chat_once(cc, args.max_tokens))

        threads = [threading.Thread(target=chatter, daemon=True) for _ in range(args.chat_clients)]
        for t in threads:
            t.start()
        try:
            mixed_s, mixed_n = run_batch(c, args.lines, args.max_tokens)
        finally:
            stop.set()
            for t in threads:
                t.join(120)
    finally:
        server.stop()
    return {
        "model": MODEL,
        "slots": args.slots,
        "lines": args.lines,
        "max_tokens": args.max_tokens,
        "batch_alone": {"seconds": round(alone_s, 3), "lines_per_s": round(alone_n / alone_s, 1)},
        "batch_with_chat": {
            "seconds": round(mixed_s, 3),
            "lines_per_s": round(mixed_n / mixed_s, 1),
            "chat_clients": args.chat_clients,
        },
        "p0_chat_idle": latency(idle),
        "p0_chat_under_batch": latency(under),
    }


# ---------------------------------------------------------------------- the store alone
RESULT = json.dumps(
    {
        "id": "batch_req_0123456789abcdef01234567",
        "custom_id": "line-000000",
        "response": {
            "status_code": 200,
            "request_id": "chatcmpl-0123456789abcdef01234567",
            "body": {
                "id": "chatcmpl-0123456789abcdef01234567",
                "object": "chat.completion",
                "created": 1700000000,
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "x" * 120},
                        "logprobs": None,
                        "finish_reason": "length",
                    }
                ],
                "usage": {"prompt_tokens": 20, "completion_tokens": 8, "total_tokens": 28},
                "laneway": {"priority": "P2", "queue_ms": 1.0, "preemptions": 0, "worker": "w0"},
            },
        },
        "error": None,
    }
)
BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "Summarise item 0."}], "max_tokens": 8}
)


def store_sync(n: int, root: Path, group: int) -> dict[str, float]:
    db = SQLiteDB(root)
    try:
        db.create_batch(
            BatchRecord("b", "", "/v1/chat/completions", "f", "24h", 2, BatchStatus.VALIDATING, 0, 9)
        )
        lines = [NewLine(i + 1, f"line-{i:06d}", BODY) for i in range(n)]
        t0 = time.perf_counter()
        db.start_batch("b", lines, 0)
        t1 = time.perf_counter()
        claimed = []
        while got := db.claim("b", "bench", group, 60.0, 1.0):
            claimed += got
        t2 = time.perf_counter()
        for line in claimed:
            db.finish("b", line.line_no, "bench", True, RESULT)
        t3 = time.perf_counter()
        db.set_status("b", BatchStatus.FINALIZING, 1)
        db.finalize("b", BatchStatus.COMPLETED, Outputs("o", "e", 1), None, 1)
        t4 = time.perf_counter()
    finally:
        db.close()
    per = 1e6 / n
    return {
        "insert_us": round((t1 - t0) * per, 2),
        "claim_us": round((t2 - t1) * per, 2),
        "finish_us": round((t3 - t2) * per, 2),
        "finalize_us": round((t4 - t3) * per, 2),
        "total_us": round((t4 - t0) * per, 2),
    }


def store_async(n: int, root: Path, group: int) -> dict[str, float]:
    async def main() -> dict[str, float]:
        store = await SQLiteStore.open(root)
        try:
            rec = BatchRecord("b", "", "/v1/chat/completions", "f", "24h", 2, BatchStatus.VALIDATING, 0, 9)
            await store.create_batch(rec)
            await store.start_batch("b", [NewLine(i + 1, f"line-{i:06d}", BODY) for i in range(n)], 0)
            t0 = time.perf_counter()
            claimed = []
            while got := await store.claim("b", "bench", group, 60.0, 1.0):
                claimed += got
            t1 = time.perf_counter()
            await asyncio.gather(*(store.finish("b", c.line_no, "bench", True, RESULT) for c in claimed))
            t2 = time.perf_counter()
        finally:
            await store.close()
        per = 1e6 / n
        return {"claim_us": round((t1 - t0) * per, 2), "finish_us": round((t2 - t1) * per, 2)}

    return asyncio.run(main())


# ---------------------------------------------------------------------- report
def print_report(result: dict[str, Any], console: Console) -> None:
    if "server" in result:
        s = result["server"]
        shape = f"{s['slots']} slots, {s['lines']} lines × {s['max_tokens']} tokens"
        t = Table(title=f"Batch API on {s['model']} ({shape})")
        for col in (
            "phase",
            "batch lines/s",
            "batch time s",
            "P0 chat p50 ms",
            "P0 p95 ms",
            "P0 max ms",
            "P0 n",
        ):
            t.add_column(col, justify="right" if col != "phase" else "left")
        idle, under = s["p0_chat_idle"], s["p0_chat_under_batch"]
        t.add_row(
            "P0 chat, idle",
            "",
            "",
            str(idle["p50_ms"]),
            str(idle["p95_ms"]),
            str(idle["max_ms"]),
            str(idle["count"]),
        )
        a = s["batch_alone"]
        t.add_row("batch alone", str(a["lines_per_s"]), str(a["seconds"]), "", "", "", "")
        m = s["batch_with_chat"]
        t.add_row(
            f"batch + {m['chat_clients']} P0 chat clients",
            str(m["lines_per_s"]),
            str(m["seconds"]),
            str(under["p50_ms"]),
            str(under["p95_ms"]),
            str(under["max_ms"]),
            str(under["count"]),
        )
        console.print(t)
    st = result["store"]
    t = Table(
        title=f"Store overhead per line (SQLite WAL, {st['lines']} lines, claims of {st['claim_group']})"
    )
    for col in ("path", "insert µs", "claim µs", "finish µs", "finalize µs", "total µs"):
        t.add_column(col, justify="right" if col != "path" else "left")
    sy, asy = st["sync"], st["async"]
    t.add_row(
        "SQLiteDB (sync)",
        *(str(sy[k]) for k in ("insert_us", "claim_us", "finish_us", "finalize_us", "total_us")),
    )
    t.add_row("SQLiteStore (async, thread hop)", "", str(asy["claim_us"]), str(asy["finish_us"]), "", "")
    console.print(t)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--chat-clients", type=int, default=2)
    p.add_argument("--chat-samples", type=int, default=20, help="idle P0 requests for the baseline")
    p.add_argument("--store-lines", type=int, default=20_000)
    p.add_argument("--claim-group", type=int, default=16)
    p.add_argument("--store-only", action="store_true", help="skip the server phases")
    p.add_argument("--json", type=Path, metavar="FILE")
    args = p.parse_args(argv)
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="laneway-batch-bench-") as tmp:
        root = Path(tmp)
        if not args.store_only:
            result["server"] = bench_server(args, root)
        result["store"] = {
            "lines": args.store_lines,
            "claim_group": args.claim_group,
            "sync": store_sync(args.store_lines, root / "sync", args.claim_group),
            "async": store_async(args.store_lines, root / "async", args.claim_group),
        }
    console = Console()
    if not console.is_terminal:
        console = Console(width=120)
    print_report(result, console)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
