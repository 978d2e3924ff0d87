"""How well any estimate made on arrival can do on ``support-desk``: laneway's wait
estimates beside one that knows the scenario's own size distributions, and beside
the best single figure chosen afterwards.

    python bench/estimate_floor.py [--cls 1] [--seed 0] [--draws 400] [--json out.json]

The simulation is laneway's, as ``laneway simulate --scenario support-desk``. Each
time it asks laneway for the wait of a new request of class ``--cls``, this also
works out the wait that the scenario's generator implies from what is known then:
each running request it cannot preempt has a service time drawn from its class's
uniform range (one that announced its size, from what that size allows within
+-30 %), longer than it has run so far; the request starts at the k-th of their
ends, k being the queue ahead of it less the free slots, plus one. The median
over ``--draws`` draws is that estimate. (It leaves out arrivals during the wait:
on this trace P0 preempts batch work rather than take a freed slot.) The best
single figure is the one constant that, known afterwards, gives the lowest
median error among the requests that waited at least 1 s.

Reported for each: the median and p90 of |estimate - wait| / wait among the
requests that waited at least 1 s, and the median of |estimate - wait| /
max(wait, 1 s) over all of them. On a class whose typical wait is about a
second, the first figure judges only the unlucky draws of the wait.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from laneway.core import Request, Scheduler, WaitRange
from laneway.sim.report import WAITED_S, percentile
from laneway.sim.scenarios import DESK_SIZES_S, HINT_ERROR, HINT_TOKENS_S, support_desk
from laneway.sim.simulation import Simulation


def remaining_draw(rng: random.Random, r: Request, now: float) -> float:
    """One draw of how long running ``r`` still needs, from support-desk's generator."""
    lo, hi = DESK_SIZES_S[r.priority]
    log_uniform = False
    if r.output_tokens > 0:  # its size was announced: service / size has density ~ 1/service
        size_s = r.output_tokens / HINT_TOKENS_S
        lo, hi = max(lo, size_s / (1 + HINT_ERROR)), min(hi, size_s / (1 - HINT_ERROR))
        log_uniform = True
    ran = now - r.started_s + r.run_s
    lo = max(lo, ran)
    if hi <= lo:
        return 0.0  # (past what its class allows: due now)
    d = lo * (hi / lo) ** rng.random() if log_uniform else rng.uniform(lo, hi)
    return d - ran


def model_estimate(sched: Scheduler, cls: int, now: float, draws: int, rng: random.Random) -> float:
    rights = sched.tables.est_rights[cls]
    running_by_class = sched.occupancy.running
    blockers = [r for v, running in enumerate(running_by_class) if v not in rights for r in running.values()]
    k = sum(sched.lanes.class_count[: cls + 1]) - sched.occupancy.free + 1
    if k <= 0 or not blockers:
        return 0.0
    k = min(k, len(blockers))
    ends = sorted(sorted(remaining_draw(rng, r, now) for r in blockers)[k - 1] for _ in range(draws))
    return ends[len(ends) // 2]


def run(cls: int, seed: int, draws: int) -> list[tuple[float, float, float]]:
    """(laneway's estimate, the scenario model's, the first wait) per sampled request."""
    sc = support_desk(seed)
    sim = Simulation(sc.requests, slots=sc.slots, policy="laneway", scenario=sc.name, seed=seed)
    rng = random.Random(seed)
    model: dict[float, float] = {}
    sched = sim.sched
    ask: Callable[..., tuple[float, WaitRange]] = sched.estimate_range

    class Watched(Scheduler):
        __slots__ = ()

        def estimate_range(
            self, c: int, m: str | None, now: float, est_service_s: float | None = None
        ) -> tuple[float, WaitRange]:
            if c == cls:  # (the simulator's sampled estimates)
                model[now] = model_estimate(self, c, now, draws, rng)
            return ask(c, m, now, est_service_s)

    sched.__class__ = Watched  # the same scheduler, watched
    res = sim.run()
    return [
        (o.estimate_s, model[o.spec.arrival_s], o.first_wait_s)
        for o in res.outcomes
        if o.status == "finished" and o.estimate_s == o.estimate_s and o.req.priority == cls
    ]


def figures(pairs: list[tuple[float, float]]) -> dict[str, float | int | None]:
    waited = [abs(e - w) / w for e, w in pairs if w >= WAITED_S]
    return {
        "waited": len(waited),
        "median": statistics.median(waited) if waited else None,
        "p90": percentile(waited, 90),
        "all_median": statistics.median(abs(e - w) / max(w, 1.0) for e, w in pairs) if pairs else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cls", type=int, default=1, help="the class whose estimates are judged (default P1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--draws", type=int, default=400, help="draws per estimate of the scenario model")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if not 0 <= args.cls < len(DESK_SIZES_S) or args.draws < 1:
        print("estimate_floor: --cls is 0-3 and --draws at least 1", file=sys.stderr)
        return 2
    rows = run(args.cls, args.seed, args.draws)
    tail = sorted(w for _, _, w in rows if w >= WAITED_S)
    best, best_err = math.nan, math.inf
    for i in range(1, 101):  # constants 0.1 ... 10 s
        c = i / 10
        err = statistics.median(abs(c - w) / w for w in tail) if tail else math.inf
        if err < best_err:
            best, best_err = c, err
    out = {
        "laneway": figures([(e, w) for e, _, w in rows]),
        "scenario model": figures([(m, w) for _, m, w in rows]),
        f"best constant ({best:.1f} s)": figures([(best, w) for _, _, w in rows]),
    }
    table = Table(title=f"support-desk P{args.cls} wait estimates, seed {args.seed}: {len(rows)} estimated")
    for col in ("estimate", "waited ≥ 1 s", "median error", "p90", "over all: max(wait, 1 s)"):
        table.add_column(col, justify="left" if col == "estimate" else "right", no_wrap=col == "estimate")
    for name, f in out.items():
        table.add_row(
            name,
            str(f["waited"]),
            *(f"{f[k]:.2f}" if f[k] is not None else "-" for k in ("median", "p90", "all_median")),
        )
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps({"cls": args.cls, "seed": args.seed, "estimates": out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
