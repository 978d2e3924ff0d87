"""Cost of one submit + dispatch in the policy core, beside a bare heapq.

For each queue size N (10^3, 10^5, 10^6 by default) the scheduler is filled
with N queued requests of random classes behind one busy slot; then each
operation submits a request, finishes the running one and calls
``schedule()``, which dispatches the next. The same run times a bare
``heapq`` push + pop on a heap of N tuples, so the ratio is measured side by
side on the same machine. Also times a 10^6-request simulation of ``mixed``.

    python bench/core_bench.py [--sizes 1000,100000,1000000] [--ops 2000] [--repeat 30]
        [--policy laneway] [--sim-requests 1000000] [--json out.json]

Rounds of heapq and of the scheduler take turns. Each round is timed in CPU
time of this thread (``time.thread_time``), so moments the machine gives the
CPU to other work do not count. A heapq round does 5 times the operations of
a scheduler round (``--ops``), so rounds of either last about as long. Each
figure is the best of ``--repeat`` rounds (the least disturbed), and "median
round" is the median of the per-round ratios. The 10^6-request simulation is timed on the wall clock.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import random
import sys
import time
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from laneway.core import Dispatch, Request, Scheduler, WorkerSpec


def heapq_rounds(n: int, ops: int, rng: random.Random) -> Callable[[int], float]:
    """A heap of ``n`` tuples; each call times one round of ``ops`` push + pop pairs."""
    heap = [(rng.randrange(4), float(i), i) for i in range(n)]
    heapq.heapify(heap)
    push, pop = heapq.heappush, heapq.heappop

    def one_round(rnd: int) -> float:
        base = n + rnd * ops
        items = [(rng.randrange(4), float(base + i), base + i) for i in range(ops)]
        t0 = time.thread_time()
        for item in items:
            push(heap, item)
            pop(heap)
        return time.thread_time() - t0

    return one_round


def core_rounds(n: int, ops: int, policy: str, rng: random.Random) -> Callable[[int], float]:
    """A scheduler with ``n`` queued requests behind one busy slot; each call
    times one round of ``ops`` operations (submit, finish the running one, schedule)."""
    sched = Scheduler([WorkerSpec("w0", 1)], policy_name=policy)
    for i in range(n):
        sched.submit(Request(f"q{i}", rng.randrange(1, 4), 0.0), 0.0)
    running = sched.schedule(0.0)[0].request_id

    def one_round(rnd: int) -> float:
        nonlocal running
        fresh = [Request(f"n{rnd}-{i}", rng.randrange(1, 4), 0.0) for i in range(ops)]
        times = [1.0 + (rnd * ops + i) * 1e-4 for i in range(ops)]
        gc.collect()
        gc.disable()
        try:
            t0 = time.thread_time()
            for req, now in zip(fresh, times, strict=True):
                req.arrival_s = now
                sched.submit(req, now)
                sched.finished(running, now)
                # the dispatch (after the rejections of queue timeouts, if a
                # long run reaches the 60 s timeout of the fill's P1 requests)
                out = sched.schedule(now)
                first = out[0]
                if type(first) is not Dispatch:
                    first = next(d for d in out if type(d) is Dispatch)
                running = first.request_id
            elapsed = time.thread_time() - t0
        finally:
            gc.enable()
        sched.check_invariants()
        return elapsed

    return one_round


# heapq rounds do this many times the operations of a scheduler round, so a
# round of either lasts about as long and is as likely to be disturbed
HEAPQ_SCALE = 5


def side_by_side(n: int, ops: int, policy: str, repeat: int) -> dict[str, float]:
    """Rounds of the two take turns, so a busy moment of the machine hits both;
    each keeps its best round."""
    base_ops = ops * HEAPQ_SCALE
    base = heapq_rounds(n, base_ops, random.Random(1))
    core = core_rounds(n, ops, policy, random.Random(1))
    pairs = [(base(rnd) / base_ops, core(rnd) / ops) for rnd in range(repeat)]
    best_base = min(b for b, _ in pairs)
    best_core = min(c for _, c in pairs)
    ratios = sorted(c / b for b, c in pairs)
    return {
        "queued": n,
        "heapq_us": best_base * 1e6,
        "core_us": best_core * 1e6,
        "ratio": best_core / best_base,
        "ratio_median_round": ratios[len(ratios) // 2],
    }


def bench_sim(requests: int) -> tuple[int, float]:
    from laneway.sim.scenarios import mixed
    from laneway.sim.simulation import simulate

    sc = mixed(0, requests=requests)
    t0 = time.perf_counter()
    result = simulate(sc.requests, slots=sc.slots, policy="laneway", scenario="mixed")
    return len(result.outcomes), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,100000,1000000")
    ap.add_argument("--ops", type=int, default=2000, help="operations per round")
    ap.add_argument("--repeat", type=int, default=30, help="rounds per size; the best is reported")
    ap.add_argument("--policy", default="laneway")
    ap.add_argument("--sim-requests", type=int, default=1_000_000, help="0 skips the simulation")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    err = Console(stderr=True)
    rows = []
    for n in sizes:
        err.print(f"[dim]queue of {n:,}: filling and timing…[/]")
        rows.append(side_by_side(n, args.ops, args.policy, args.repeat))
    table = Table(
        title=f"submit + dispatch ({args.policy} policy, {args.repeat} rounds of {args.ops:,} ops)",
        caption="op: submit a request, finish the running one, schedule() dispatches the next",
    )
    for col in (
        "queued",
        "heapq push+pop (µs)",
        "laneway op (µs)",
        "ratio",
        "median round",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            f"{r['queued']:,}",
            f"{r['heapq_us']:.2f}",
            f"{r['core_us']:.2f}",
            f"{r['ratio']:.1f}×",
            f"{r['ratio_median_round']:.1f}×",
        )
    console = Console()
    console.print(table)
    out: dict[str, object] = {"policy": args.policy, "ops": args.ops, "rows": rows}
    if args.sim_requests:
        err.print(f"[dim]simulating mixed with ~{args.sim_requests:,} requests…[/]")
        count, secs = bench_sim(args.sim_requests)
        console.print(
            f"simulation of mixed: {count:,} requests in {secs:.1f} s ({secs / count * 1e6:.1f} µs each)"
        )
        out["sim"] = {"requests": count, "seconds": secs}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
