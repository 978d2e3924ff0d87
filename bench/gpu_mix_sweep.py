"""Same-model grouping on ``gpu-mix`` over many seeds, laneway against naive placement.

    python bench/gpu_mix_sweep.py [--seeds 10] [--json out.json]

For each seed, the scenario ``laneway simulate --scenario gpu-mix --seed S`` runs under
``laneway`` and ``naive`` (one request per GPU, the first idle GPU that fits, no model
affinity). Printed per seed: model loads under each and their ratio (the goal: at most
a third of naive's), P0 chat's wait p99, and how many of the 70B requests (4 GPUs each)
completed under laneway.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from laneway.sim.report import percentile
from laneway.sim.scenarios import scenario
from laneway.sim.simulation import SimResult, simulate

BIG = "big-70b"


def figures(seed: int) -> dict[str, float]:
    sc = scenario("gpu-mix", seed)
    runs: dict[str, SimResult] = {
        p: simulate(sc.requests, slots=sc.slots, policy=p, inventory=sc.inventory, seed=seed)
        for p in ("laneway", "naive")
    }
    lw, nv = (runs[p].scheduler.counters.model_loads for p in ("laneway", "naive"))
    outcomes = runs["laneway"].outcomes
    big = [o for o in outcomes if o.spec.model == BIG]
    return {
        "seed": seed,
        "loads_laneway": lw,
        "loads_naive": nv,
        "ratio": lw / nv if nv else math.inf,
        "p0_wait_p99_s": percentile([o.first_wait_s for o in outcomes if o.spec.priority == 0], 99) or 0.0,
        "big_done": sum(o.status == "finished" for o in big),
        "big_total": len(big),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 (default 10)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error("--seeds: at least 1")
    table = Table(title="gpu-mix: model loads, laneway vs naive placement")
    for col in ("seed", "loads laneway / naive", "ratio", "P0 wait p99 s", "70B done"):
        table.add_column(col, justify="right")
    rows = []
    for seed in range(args.seeds):
        print(f"seed {seed}/{args.seeds - 1} ...", file=sys.stderr, flush=True)
        f = figures(seed)
        rows.append(f)
        table.add_row(
            str(seed),
            f"{f['loads_laneway']} / {f['loads_naive']}",
            f"{f['ratio']:.2f}",
            f"{f['p0_wait_p99_s']:.2f}",
            f"{f['big_done']} / {f['big_total']}",
        )
    Console().print(table)
    print(f"worst ratio {max(r['ratio'] for r in rows):.2f} (goal: at most 0.33)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
