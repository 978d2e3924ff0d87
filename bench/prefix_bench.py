"""What a prompt's prefix identity costs at admission, and placing by it in the core.

    python bench/prefix_bench.py [--repeat 2000]

For chat prompts of a system prompt of 1k, 6k and 24k characters (and a short question),
times ``prefix_of`` (the block hashes, :mod:`laneway.runtime.prefix`), and one placement
by them on 2 and 32 workers (:class:`~laneway.core.placement.SlotPlacement`, spread
``prefix``: a submit, the dispatch and the finish, minus the same with no prefix). Each
figure is the best of 5 rounds of ``--repeat`` (thread CPU time), in µs.
"""

from __future__ import annotations

import argparse
import sys
import time

from rich.console import Console
from rich.table import Table

from laneway.core import Dispatch, Request, Scheduler, WorkerSpec
from laneway.generation import Job, SamplingParams
from laneway.runtime.prefix import prefix_of


def job(chars: int, i: int) -> Job:
    system = ("You are agent seven and you review code with care. " * (chars // 50 + 1))[:chars]
    messages = ({"role": "system", "content": system}, {"role": "user", "content": f"question {i}"})
    return Job(f"j{i}", "m", SamplingParams(max_tokens=1), messages=messages)


def best_us(fn: object, repeat: int) -> float:
    rounds = []
    for _ in range(5):
        t0 = time.thread_time()
        for i in range(repeat):
            fn(i)  # type: ignore[operator]
        rounds.append((time.thread_time() - t0) / repeat * 1e6)
    return min(rounds)


def placement_us(workers: int, prefixes: list[tuple[int, ...]], repeat: int) -> float:
    sched = Scheduler([WorkerSpec(f"w{k}", 4) for k in range(workers)])

    def op(i: int) -> None:
        sched.submit(
            Request(f"r{i}-{time.perf_counter_ns()}", 2, 0.0, prefix=prefixes[i % len(prefixes)]), 0.0
        )
        (d,) = sched.schedule(0.0)
        assert type(d) is Dispatch
        sched.finished(d.request_id, 0.0)

    return best_us(op, repeat)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2000)
    args = ap.parse_args(argv)
    t = Table(title="prefix identity at admission and placement by it (µs, best of 5 rounds)")
    for c in ("system prompt", "blocks", "prefix_of", "placement, 2 workers", "placement, 32 workers"):
        t.add_column(c, justify="right")
    for chars in (1_000, 6_000, 24_000):
        jobs = [job(chars, i) for i in range(64)]
        prefixes = [prefix_of(j) for j in jobs]  # 64 agents
        hashing = best_us(lambda i, jobs=jobs: prefix_of(jobs[i % 64]), args.repeat)
        extra = []
        for n in (2, 32):
            with_prefix = placement_us(n, prefixes, args.repeat)
            without = placement_us(n, [()], args.repeat)
            extra.append(f"{with_prefix - without:.1f}")
        t.add_row(f"{chars:,} chars", str(len(prefixes[0])), f"{hashing:.1f}", *extra)
    Console().print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
