"""What ``routing_bench.py`` prints: a line as each mode ends, and the table of all."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table


def _shares(values: list[float]) -> str:
    return " / ".join(f"{x:.0%}" for x in values)


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def progress_line(r: dict[str, Any]) -> str:
    """One mode's result in a line: makespan, TTFT p50, prefix hits (and what laneway
    expected), how often each engine ran 0/1/2/3/4+ requests after the first turns."""
    held = r["idle_with_work_fraction"]
    return (
        f"makespan {r['makespan_s']:.1f} s, TTFT p50 {r['ttft_p50_s']:.2f} s, "
        f"prefix hits {_shares(r['prefix_hit_rate'])}"
        + (f" (laneway expected {_shares(r['expected_hit_rate'])})" if r["expected_hit_rate"] else "")
        + (f", {r['preempted']} preempted" if r["preempted"] else "")
        + (
            f", {r['turns_cached']} of {r['requests']} turns cached by the engine's own account"
            f" (TTFT p50 {_s(r['ttft_p50_cached_s'])}, the others {_s(r['ttft_p50_uncached_s'])})"
            if r.get("turns_cached") is not None
            else ""
        )
        + (
            f", the agents queued in laneway {r['agents_queued_mean_s'] * 1000:.1f} ms on average"
            if r.get("agents_queued_mean_s") is not None
            else ""
        )
        + ", after the first turns the engines ran 0/1/2/3/4+ "
        + " and ".join("/".join(f"{x:.0%}" for x in e) for e in r["running_later"])
        + f" of the time, latency mean later {r['latency_mean_later_s'] or 0:.2f} s"
        + (f", engines idle with work sent to them {_shares(held)}" if held[0] is not None else "")
        + (
            ", of the requests sent to each engine not run "
            + " / ".join(f"{x:.2f}" for x in r["held_not_run_mean"])
            + " on average ("
            + " / ".join(f"{x:.2f}" for x in r["engine_waiting_mean"])
            + " in its queue)"
            if r.get("held_not_run_mean") and r["held_not_run_mean"][0] is not None
            else ""
        )
    )


def table(args: argparse.Namespace, total: int, flooded: bool, results: list[dict[str, Any]]) -> Table:
    """Every mode's row: TTFT, the decode after it, makespan, the engines' prefix hits."""
    beside = f", beside {args.flood} batch requests of {args.flood_tokens} tokens" if flooded else ""
    beside += ", the engines ordering by priority" if args.priority else ""
    kv = f"KV {args.kv_tokens:,} tokens each" if args.kv_tokens else "vLLM's own KV size"
    t = Table(
        title=f"{args.requests} streamed chats of {args.agents} agents ({total:,} prompt tokens, "
        f"{args.order}) over two vLLM engines ({kv}){beside}"
    )
    t.add_column("mode", no_wrap=True)
    for c in (
        "TTFT p50 s",
        "TTFT p99 s",
        "TTFT mean s",
        "TTFT mean s, first turns / later",
        "then to the end, mean s",
        "makespan s",
        "after the first turns s",
        "prefix hits (engines)",
        "laneway expected",
        "ran nothing (engines)",
    ):
        t.add_column(c, justify="right")
    if flooded:
        t.add_column("flood makespan s", justify="right")
    for r in results:
        row = [
            r["mode"],
            f"{r['ttft_p50_s']:.2f}",
            f"{r['ttft_p99_s']:.2f}",
            f"{r['ttft_mean_s']:.2f}",
            " / ".join(
                "-" if x is None else f"{x:.2f}" for x in (r["ttft_mean_first_s"], r["ttft_mean_later_s"])
            ),
            f"{r['rest_mean_s']:.2f}",
            f"{r['makespan_s']:.1f}",
            f"{r['makespan_s'] - r['first_turns_end_s']:.1f}",
            _shares(r["prefix_hit_rate"]),
            _shares(r["expected_hit_rate"]) if r["expected_hit_rate"] else "-",
            _shares(r["idle_fraction"]),
        ]
        if flooded:
            row.append("-" if r["flood_makespan_s"] is None else f"{r['flood_makespan_s']:.1f}")
        t.add_row(*row)
    return t
