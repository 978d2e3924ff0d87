"""How far one tenant gets ahead of another inside a class, on ``two-tenants``.

    python bench/tenant_gap.py [--seed 0] [--json out.json]

The simulation is laneway's, as ``laneway simulate --scenario two-tenants``, with
token-fair tenants (the default) and with FIFO inside the class
(``--no-fair-tenants``). Over every stretch of time while both tenants have work
queued, it adds up the work (service seconds) each tenant started; the gap is
the difference between the two. Start-time fair queueing bounds it by one
request's cost of each tenant (here up to 40 s each); under FIFO the big tenant's
backlog goes first and the gap grows with it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from laneway.core import SchedulerConfig
from laneway.sim.report import percentile
from laneway.sim.scenarios import two_tenants
from laneway.sim.simulation import SimResult, simulate


def both_queued(res: SimResult, a: str, b: str) -> list[tuple[float, float]]:
    """The stretches of time while tenants ``a`` and ``b`` both had work queued."""
    events = []
    for o in res.outcomes:
        if o.spec.tenant in (a, b) and o.status == "finished":
            events += [(o.spec.arrival_s, 1, o.spec.tenant), (o.req.first_start_s, -1, o.spec.tenant)]
    events.sort(key=lambda e: (e[0], e[1]))  # (a start before an arrival at the same time)
    queued = {a: 0, b: 0}
    out: list[tuple[float, float]] = []
    since: float | None = None
    for t, delta, tenant in events:
        queued[tenant] += delta
        if queued[a] and queued[b]:
            since = t if since is None else since
        elif since is not None:
            out.append((since, t))
            since = None
    return out


def figures(res: SimResult) -> dict[str, float | int | None]:
    spans = both_queued(res, "big", "small")
    started = sorted(
        (o.req.first_start_s, o.spec.tenant, o.spec.duration_s)
        for o in res.outcomes
        if o.status == "finished"
    )
    gaps = []
    for t1, t2 in spans:
        work = {"big": 0.0, "small": 0.0}
        for t, tenant, duration in started:
            if t1 <= t <= t2:
                work[tenant] += duration or 0.0
        gaps.append(abs(work["big"] - work["small"]))
    small = [o.wait_s for o in res.outcomes if o.spec.tenant == "small" and o.status == "finished"]
    return {
        "stretches": len(spans),
        "longest_s": max((t2 - t1 for t1, t2 in spans), default=0.0),
        "max_gap_s": max(gaps, default=0.0),
        "small_wait_p99_s": percentile(small, 99),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    sc = two_tenants(args.seed)
    largest = max(r.duration_s or 0.0 for r in sc.requests)
    out = {}
    for name, fair in (("token-fair (default)", True), ("FIFO inside the class", False)):
        res = simulate(
            sc.requests,
            slots=sc.slots,
            policy="laneway",
            config=SchedulerConfig(fair_tenants=fair),
            seed=args.seed,
        )
        out[name] = figures(res)
    table = Table(title=f"two-tenants, seed {args.seed}: work started while both tenants had work queued")
    for col in ("inside the class", "stretches", "longest s", "max gap s", "small's wait p99 s"):
        first = col == "inside the class"
        table.add_column(col, justify="left" if first else "right", no_wrap=first)
    for name, f in out.items():
        table.add_row(
            name,
            str(f["stretches"]),
            f"{f['longest_s']:,.1f}",
            f"{f['max_gap_s']:,.1f}",
            f"{f['small_wait_p99_s']:,.1f}",
        )
    Console().print(table)
    print(
        "stretches: spells of time while both tenants had work queued; longest s: the longest spell;\n"
        "max gap s: over a spell, the most service seconds one tenant started beyond the other;\n"
        "small's wait p99 s: the small tenant's queue wait, 99th percentile"
    )
    print(f"the bound of start-time fair queueing: one request of each, up to {2 * largest:.0f} s here")
    if args.json:
        args.json.write_text(json.dumps({"seed": args.seed, "largest_s": largest, "figures": out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
