"""Every decision of every simulated scenario, recorded, so that a change to the core can
show it decides exactly as before.

    python bench/decision_record.py --out before.json          # record
    python bench/decision_record.py --compare before.json      # record again and compare

Each run is a scenario (with its seed) under one policy: every scenario under every
policy on seeds 0-2, gpu-mix on seeds 0-4 (naive included), mixed at 20,000 requests,
two-tenants without fair tenants. For each run it keeps three digests and the ``--json``
summary:

- decisions: every decision ``schedule`` returned, in order, with the clock value
  (dispatch, preempt, reject, load, evict and their fields) and every refusal at submission;
- outcomes: each request's status, reason, first start, end, time queued and preemptions;
- estimates: the wait estimate and interval each request was told at submission.

A comparison prints one line per run and names the first differing decision.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from laneway.core import POLICIES, SchedulerConfig
from laneway.core.policies import compared
from laneway.sim import simulation as sim_engine
from laneway.sim.report import summarize
from laneway.sim.scenarios import SCENARIOS, scenario

GPU_SEEDS = range(5)
SEEDS = range(3)


def runs() -> Iterator[tuple[str, str, int, dict[str, int], bool]]:
    """(scenario, policy, seed, params, fair tenants) of every recorded run."""
    for name in SCENARIOS:
        gpus, caches = name == "gpu-mix", name == "agents"
        policies = [p for p in POLICIES if compared(p, gpus=gpus, caches=caches)]
        for seed in GPU_SEEDS if gpus else SEEDS:
            for policy in policies:
                yield name, policy, seed, {}, True
    for policy in POLICIES:
        if compared(policy, gpus=False, caches=False):
            yield "mixed", policy, 0, {"requests": 20_000}, True
            yield "two-tenants", policy, 0, {}, False


# fields decisions gained after records were made, left out at their defaults so that
# records stay comparable (a sleep-mode Load's ``wake``, Evict's ``sleep``)
LATER_FIELDS = {"wake": False, "sleep": False}


def plain(value: object) -> object:
    """A decision's fields as plain JSON-ready values (named tuples or dataclasses)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = tuple(getattr(value, f.name) for f in dataclasses.fields(value))
    fields = getattr(value, "_fields", None)
    if isinstance(value, tuple) and fields is not None:
        value = tuple(
            v for f, v in zip(fields, value, strict=True) if not (f in LATER_FIELDS and v == LATER_FIELDS[f])
        )
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    if hasattr(value, "value") and isinstance(value.value, str):  # a string-valued enum
        return value.value
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


class Digest:
    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.count = 0
        self.first: list[object] = []  # the first entries, to name a difference

    def add(self, entry: object) -> None:
        line = json.dumps(entry, separators=(",", ":"), default=str)
        self.h.update(line.encode())
        self.h.update(b"\n")
        self.count += 1

    def hexdigest(self) -> str:
        return self.h.hexdigest()


@contextmanager
def recording(digest: Digest, log: list[str] | None) -> Iterator[None]:
    """Record every decision the simulated scheduler returns (and every refusal at
    submission), whatever class implements it."""
    sim_cls = sim_engine.Simulation
    original_init = sim_cls.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        sched = self.sched
        schedule = sched.schedule
        submit = sched.submit

        class Recorder:
            def __getattr__(self, name: str) -> Any:
                return getattr(sched, name)

            def schedule(self, now: float) -> Any:
                out = schedule(now)
                for d in out:
                    entry = [round(now, 9), type(d).__name__, plain(d)]
                    digest.add(entry)
                    if log is not None:
                        log.append(json.dumps(entry, default=str))
                return out

            def submit(self, req: Any, now: float) -> Any:
                refused = submit(req, now)
                if refused is not None:
                    entry = [round(now, 9), "Refused", plain(refused)]
                    digest.add(entry)
                    if log is not None:
                        log.append(json.dumps(entry, default=str))
                return refused

        self.sched = Recorder()

    sim_cls.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        sim_cls.__init__ = original_init  # type: ignore[method-assign]


def record_one(
    name: str, policy: str, seed: int, params: dict[str, int], fair: bool, keep_log: bool
) -> dict[str, Any]:
    sc = scenario(name, seed, **params)
    decisions = Digest()
    log: list[str] | None = [] if keep_log else None
    config = None if fair else SchedulerConfig(fair_tenants=False)
    with recording(decisions, log):
        result = sim_engine.simulate(
            sc.requests,
            slots=sc.slots,
            policy=policy,
            scenario=sc.name,
            seed=seed,
            inventory=sc.inventory,
            workers=sc.workers,
            caches=sc.caches,
            config=config,
        )
    outcomes = Digest()
    estimates = Digest()
    for o in result.outcomes:
        r = o.req
        outcomes.add(
            [
                o.spec.id,
                o.status,
                o.reason,
                plain(round(r.first_start_s, 9)),
                plain(round(o.end_s, 9)),
                round(r.queued_total_s, 9),
                r.preemptions,
            ]
        )
        rng = o.estimate_range
        estimates.add([o.spec.id, plain(o.estimate_s), plain(rng)])
    summary = summarize(result)
    return {
        "decisions": decisions.hexdigest(),
        "decision_count": decisions.count,
        "outcomes": outcomes.hexdigest(),
        "estimates": estimates.hexdigest(),
        "summary": summary,
        "log": log,
    }


def key(name: str, policy: str, seed: int, params: dict[str, int], fair: bool) -> str:
    extra = "".join(f" {k}={v}" for k, v in params.items()) + ("" if fair else " no-fair-tenants")
    return f"{name} seed {seed} {policy}{extra}"


def decisions_only(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary less its estimate figures (which item may change where stated)."""
    out = {k: v for k, v in summary.items() if "estimate" not in k}
    out["classes"] = {
        c: {k: v for k, v in figs.items() if "estimate" not in k and "inside" not in k}
        for c, figs in summary.get("classes", {}).items()
    }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write the record here (JSON)")
    ap.add_argument("--compare", type=Path, help="compare with this earlier record")
    ap.add_argument("--only", help="only runs whose name contains this")
    args = ap.parse_args(argv)
    before = json.loads(args.compare.read_text()) if args.compare else None
    record: dict[str, Any] = {}
    same = differ = estimates_differ = 0
    t_all = time.perf_counter()
    for name, policy, seed, params, fair in runs():
        k = key(name, policy, seed, params, fair)
        if args.only and args.only not in k:
            continue
        t0 = time.perf_counter()
        rec = record_one(name, policy, seed, params, fair, keep_log=False)
        rec.pop("log")
        record[k] = rec
        status = f"{rec['decision_count']:>8} decisions"
        if before is not None:
            old = before.get(k)
            if old is None:
                status += "  (not in the earlier record)"
            elif old["decisions"] == rec["decisions"] and old["outcomes"] == rec["outcomes"]:
                same += 1
                if old["estimates"] != rec["estimates"]:
                    estimates_differ += 1
                    status += "  same decisions; estimates differ"
                else:
                    status += "  same"
            else:
                differ += 1
                status += "  DIFFERENT: " + first_difference(name, policy, seed, params, fair, old)
        print(f"{k:<48} {status}  ({time.perf_counter() - t0:.1f} s)", flush=True)
    print(f"{len(record)} runs in {time.perf_counter() - t_all:.0f} s", flush=True)
    if before is not None:
        print(f"same decisions: {same}, different: {differ}, estimates differ: {estimates_differ}")
    if args.out:
        args.out.write_text(json.dumps(record, indent=1, sort_keys=True, allow_nan=False))
    return 1 if differ else 0


def first_difference(
    name: str, policy: str, seed: int, params: dict[str, int], fair: bool, old: dict[str, Any]
) -> str:
    """What differs (the summary's figures; the log is not kept in a record)."""
    rec = record_one(name, policy, seed, params, fair, keep_log=False)
    a, b = decisions_only(old["summary"]), decisions_only(rec["summary"])
    if a != b:
        diffs = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        return "summary differs in " + ", ".join(diffs)
    return f"decision count {old['decision_count']} -> {rec['decision_count']}"


if __name__ == "__main__":
    sys.exit(main())
