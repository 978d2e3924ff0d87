"""An urgent request beside a batch request whose long prompt the in-process engine is
prefilling: ``laneway serve`` on its default model (SmolLM2), a P3 completion of N prompt
tokens sent, and 3 s later (its prefill under way) a short P0 chat; the P0's whole time
against the same P0 alone. The engine prefills 512 tokens a step and a less urgent prompt's
chunks wait while more urgent work runs, so the P0 should take about what it takes alone.

    python bench/prefill_bench.py [--prompt-tokens 4000,8000] [--model builtin:smollm2]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
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

URGENT = {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 5, "temperature": 0}


def urgent(url: str, model: str) -> float:
    t = time.monotonic()
    body = {"model": model, **URGENT, "priority": "P0"}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return time.monotonic() - t


def beside(url: str, model: str, tokens: int, lead_s: float) -> dict[str, Any]:
    """The P0's time with a P3 of ``tokens`` prompt tokens sent ``lead_s`` before it."""
    batch: dict[str, Any] = {}

    def send() -> None:
        t = time.monotonic()
        body = {"model": model, "prompt": [1] * tokens, "max_tokens": 5, "priority": "P3"}
        r = httpx.post(url + "/v1/completions", json=body, timeout=900)
        r.raise_for_status()
        batch["s"] = time.monotonic() - t
        batch["preemptions"] = r.json().get("laneway", {}).get("preemptions")

    th = threading.Thread(target=send)
    th.start()
    time.sleep(lead_s)
    p0 = urgent(url, model)
    th.join(900)
    return {
        "prompt_tokens": tokens,
        "p0_s": p0,
        "batch_s": batch.get("s"),
        "preemptions": batch.get("preemptions"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-tokens", default="4000,8000", help="the batch prompts' lengths (a,b)")
    ap.add_argument("--model", default="builtin:smollm2")
    ap.add_argument("--lead-s", type=float, default=3.0, help="how long the P0 comes after the P3")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    lengths = [int(x) for x in args.prompt_tokens.split(",") if x.strip()]
    with tempfile.TemporaryDirectory(prefix="prefill-bench-") as tmp:
        data = Path(tmp)
        serve = ("--model", args.model, "--data-dir", str(data / "d"))
        with serve_process(*serve, log=data / "serve.log") as server:
            urgent(server.url, args.model)  # (warm)
            alone = min(urgent(server.url, args.model) for _ in range(3))
            runs = [beside(server.url, args.model, n, args.lead_s) for n in lengths]
    table = Table(title=f"a P0 chat beside a P3 whose prompt is being prefilled ({args.model})")
    for col in ("P3 prompt tokens", "P0 s", "P0 / alone", "the P3 s", "P3 preempted"):
        table.add_column(col, justify="right")
    table.add_row("(none: alone)", f"{alone:.2f}", "1.00", "-", "-")
    for r in runs:
        table.add_row(
            f"{r['prompt_tokens']:,}", f"{r['p0_s']:.2f}", f"{r['p0_s'] / alone:.2f}", f"{r['batch_s']:.1f}",
            str(r["preemptions"]),
        )  # fmt: skip
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps({"alone_s": alone, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
