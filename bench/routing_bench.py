"""Many agents over two real vLLM engines: laneway beside client-side balancers straight to them.

    python bench/routing_bench.py --vllm VENV --model DIR [--agents 60] [--requests 240]
        [--clients 4] [--prompt-words 560] [--tokens 32] [--slots 4] [--order rounds|cyclic|random]
        [--kv-share 0.7 | --kv-tokens N]
        [--modes round-robin,laneway-rr,laneway,laneway-isolated,laneway-no-guard]
        [--flood N --flood-tokens 256] [--priority]
        [--json out.json]

Two ``vllm serve`` processes (prefix caching on, the CPU build), one pinned to each core
(``DIR``: SmolLM2-135M-Instruct as ``scripts/vllm-cpu smollm2`` makes it). ``--agents``
agents each have a system prompt of ``--prompt-words`` words of their own; ``--requests``
streamed chat requests (each agent once a round, in an order drawn for each round; with
``--order cyclic`` agent ``i % agents``, with ``--order random`` an agent drawn at random;
a question of its own, ``--tokens`` tokens) are sent by ``--clients`` clients, each taking
the next request when its last one ended. Each engine's KV cache holds ``--kv-share`` of
the agents' system prompts together (0.7: more than one engine holds, less than two;
``--num-gpu-blocks-override``), so that where a prompt goes decides whether it stays cached.
Every mode sends the same requests in the same order, the engines' prefix caches emptied
before each
(``POST /reset_prefix_cache``, vLLM's dev mode):

- ``round-robin``: straight to the engines, request ``i`` to engine ``i % 2``;
- ``least-loaded``: straight to the engine with fewer of this client's requests in flight;
- ``laneway-rr``: through ``laneway serve``, two upstream workers of ``--slots`` slots,
  ``[scheduler] placement = "round-robin"``: requests dispatched to them in turn, so that
  only the path differs from ``round-robin``;
- ``laneway``: through ``laneway serve`` with nothing configured but the two workers (its
  default placement: where the prompt is likely cached, else the least loaded);
- ``laneway-isolated``: the same with ``isolate = true`` on both workers: urgent work runs
  with no batch work beside it (each engine, one core, is compute-bound);
- ``laneway-no-guard``: laneway's default with ``[scheduler] prefill_guard = false``: an
  urgent long prefill may run beside other prefills (with ``--flood``, its own idle
  reference too).

Reported per mode: time to first token p50/p99 and mean, the mean time from the first
token to the end (the decode, which no placement shortens: with ``--clients`` clients busy
throughout, the makespan is about ``requests × (TTFT mean + that) ÷ clients``), the TTFT
mean of the agents' first turns (a miss under any placement) apart from the later turns',
makespan, and the part of it after the last first turn ended (where placement can tell),
each engine's prefix-cache hit rate (its own ``vllm:prefix_cache_*`` counters) beside, through
laneway, the rate laneway's index expected of it (the share of the prompt blocks it sent each
engine that it took to be held there: how far a precise source, such as vLLM's KV-cache
events, could improve on the estimate), and how often it ran nothing (its
``vllm:num_requests_running`` sampled every 0.25 s), how often it ran nothing with work
sent to it, and how many of the requests sent to it (by laneway, or straight by the
clients) it did not run, on average (in its own queue: ``vllm:num_requests_waiting``; or on
their way in or out of its API server: sent and not yet run, or done and not yet
answered); through laneway also how long the agents waited in laneway's queues. How many
turns the engine had at least half of the prompt cached for, by its own account (each
answer's ``usage.prompt_tokens_details.cached_tokens``: the engines run with
``--enable-prompt-tokens-details``, and laneway passes the upstream's usage on), with the
TTFT p50 of those and of the others.

With ``--flood N``, N batch requests (a document of their own each, ``--flood-tokens``
tokens out) are sent at once when the agents start: through laneway as P3, the agents as
P0; straight to the engines in the mode's way (round-robin, or to the one with fewer in
flight). A first run, ``laneway (idle)``, has the agents alone through laneway: the P0
idle reference. Reported beside: the flood's makespan. With ``--priority`` the engines
run ``--scheduling-policy priority`` (the same FCFS order for requests that carry none)
and laneway's workers ``forward_priority = true``: inside each engine's batch, too, the
agents go first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from agents_workload import MODEL, engine_parser, flood_bodies, prompt_tokens, workload
from chat_stream import turn
from laneway.testing import VLLM_MAX_MODEL_LEN, exit_on_sigterm, serve_process
from routing_engines import Engines, engines
from routing_report import progress_line, table

HOST = "127.0.0.1"
REQUEST_TIMEOUT_S = 600.0
err = Console(stderr=True)


@contextlib.contextmanager
def gateway(
    tmp: Path,
    urls: list[str],
    slots: int,
    placement: str | None = None,
    forward_priority: bool = False,
    isolate: bool = False,
    guard: bool = True,
) -> Iterator[str]:
    toml = f'[server]\nhost = "{HOST}"\ndata_dir = "{tmp / "data"}"\n'
    if placement is not None or not guard:
        toml += "\n[scheduler]\n"
        toml += f'placement = "{placement}"\n' if placement is not None else ""
        toml += "prefill_guard = false\n" if not guard else ""
    for i, url in enumerate(urls):
        toml += (
            f'\n[[workers]]\nname = "up{i}"\ntype = "upstream"\nurl = "{url}"\nmodel = "{MODEL}"\n'
            f'served_name = "{MODEL}"\nslots = {slots}\n'
            + ("forward_priority = true\n" if forward_priority else "")
            + ("isolate = true\n" if isolate else "")
        )
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = tmp / "laneway.toml"
    cfg.write_text(toml)
    with serve_process("--config", str(cfg), "--access-log", log=tmp / "laneway.log") as server:
        yield server.url + "/v1"


# --------------------------------------------------------------------------- one run
async def run(
    mode: str,
    bodies: list[dict[str, Any]],
    eng: Engines,
    via: str | None,
    clients: int,
    flood: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    flood = flood or []
    if via is not None and flood:  # through laneway: the agents urgent, the flood batch work
        bodies = [{**b, "priority": "P0"} for b in bodies]
        flood = [{**b, "priority": "P3"} for b in flood]
    queue = list(enumerate(bodies))
    queue.reverse()
    ttfts: list[float] = [0.0] * len(bodies)
    latencies: list[float] = [0.0] * len(bodies)
    ends: list[float] = [0.0] * len(bodies)
    cached: list[float | None] = [None] * len(bodies)  # (the share of its prompt the engine had)
    # (an agent's first turn: its system prompt in no engine's cache whatever the placement)
    first: list[bool] = []
    seen: set[str] = set()
    for b in bodies:
        system = b["messages"][0]["content"]
        first.append(system not in seen)
        seen.add(system)
    in_flight = [0] * len(eng.urls)
    per_engine = [0] * len(eng.urls)
    flood_ends: list[float] = []
    conns = clients + len(flood) + 8
    limits = httpx.Limits(max_connections=conns, max_keepalive_connections=conns)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:

        def engine_for(i: int) -> int:
            return i % 2 if mode == "round-robin" else min(range(2), key=lambda k: (in_flight[k], k))

        async def batch_job(i: int, body: dict[str, Any]) -> None:
            e = engine_for(i) if via is None else -1
            url = via if via is not None else eng.urls[e]
            if e >= 0:
                in_flight[e] += 1
            try:
                r = await client.post(url + "/chat/completions", json=body)
                if r.status_code != 200:
                    raise RuntimeError(f"flood job {i}: HTTP {r.status_code}: {r.text[:300]}")
                flood_ends.append(time.perf_counter())
            finally:
                if e >= 0:
                    in_flight[e] -= 1

        async def one_client() -> None:
            while queue:
                i, body = queue.pop()
                if via is None:
                    e = engine_for(i)
                    url = eng.urls[e]
                else:
                    url, e = via, -1
                if e >= 0:
                    in_flight[e] += 1
                    per_engine[e] += 1
                try:
                    ttfts[i], latencies[i], cached[i] = await turn(client, url, body)
                    ends[i] = time.perf_counter() - t0
                finally:
                    if e >= 0:
                        in_flight[e] -= 1

        stop = asyncio.Event()
        sampler = asyncio.create_task(eng.sample(client, stop, via, in_flight))
        before = eng.counters()
        t0 = time.perf_counter()
        jobs = [asyncio.create_task(batch_job(i, b)) for i, b in enumerate(flood)]
        await asyncio.sleep(0.5 if flood else 0.0)  # (the flood first: the engines full)
        await asyncio.wait_for(asyncio.gather(*(one_client() for _ in range(clients))), REQUEST_TIMEOUT_S * 4)
        makespan = time.perf_counter() - t0
        await asyncio.wait_for(asyncio.gather(*jobs), REQUEST_TIMEOUT_S * 4)
        flood_makespan = max(flood_ends) - t0 if flood_ends else None
        stop.set()
        await sampler
        preempted = None
        expected: list[float] | None = None
        queued: float | None = None
        if via is not None:  # (what laneway stopped to make room: each resume is another prefill)
            text = (await client.get(via.removesuffix("/v1") + "/metrics", timeout=5)).text
            found = re.findall(r"^laneway_preemptions_total\{[^}]*\} (\S+)$", text, re.M)
            preempted = round(sum(float(v) for v in found))
            # how long the agents waited in laneway's queues (the flood is P3): the rest of
            # their time to first token is the path and the engine's
            waits = {
                (cls, part): float(v)
                for part, cls, v in re.findall(
                    r'^laneway_queue_wait_seconds_(sum|count)\{class="([^"]+)"\} (\S+)$', text, re.M
                )
            }
            n = sum(v for (cls, part), v in waits.items() if part == "count" and cls != "P3")
            if n:
                queued = sum(v for (cls, part), v in waits.items() if part == "sum" and cls != "P3") / n
            # what laneway's index expected of each engine's cache (its prompts' blocks it
            # placed where it took them to be held), beside what the engines report
            ratios = dict(
                re.findall(
                    r'^laneway_worker_prefix_hit_ratio_expected\{worker="up(\d+)"\} (\S+)$', text, re.M
                )
            )
            expected = [
                float(ratios[str(i)]) if str(i) in ratios else float("nan") for i in range(len(eng.urls))
            ]
    after = eng.counters()
    hits = []
    for b, a in zip(before, after, strict=True):
        q = a["vllm:prefix_cache_queries_total"] - b["vllm:prefix_cache_queries_total"]
        h = a["vllm:prefix_cache_hits_total"] - b["vllm:prefix_cache_hits_total"]
        hits.append(h / q if q else float("nan"))
    idle = [sum(1 for x in s if x == 0) / len(s) if s else float("nan") for s in eng.samples]
    # how often an engine ran nothing with work sent to it (by laneway, or the clients)
    idle_held = [
        sum(1 for x, h in zip(s, hs, strict=False) if x == 0 and h > 0) / len(s) if s and hs else None
        for s, hs in zip(eng.samples, eng.held, strict=True)
    ]
    # of the requests sent to an engine, on average, how many it did not run: in its own
    # queue, or on their way (sent and not yet run, or done and not yet answered)
    unrun = [
        statistics.fmean(max(h - x, 0.0) for x, h in zip(s, hs, strict=False)) if s and hs else None
        for s, hs in zip(eng.samples, eng.held, strict=True)
    ]
    queued_in_engine = [statistics.fmean(w) if w else None for w in eng.waiting]
    # the turns whose prompt the engine had at least half cached, by its own usage, and the others
    hit = [c is not None and c >= 0.5 for c in cached]
    said = any(c is not None for c in cached)
    ordered = sorted(ttfts)
    later = [not f for f in first]
    first_end = max((e for e, f in zip(ends, first, strict=True) if f), default=0.0)
    # after the first turns: the share of samples each engine ran 0, 1, 2, 3, 4 or more
    late = [[x for x, at in zip(s, eng.at, strict=False) if at - t0 >= first_end] for s in eng.samples]
    running_later = [
        [sum(1 for x in s if min(int(x), 4) == k) / len(s) if s else 0.0 for k in range(5)] for s in late
    ]
    return {
        "mode": mode,
        "requests": len(bodies),
        "ttft_p50_s": statistics.median(ordered),
        "ttft_p99_s": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
        "makespan_s": makespan,
        "ttft_mean_s": statistics.fmean(ttfts),
        # (after the first text: the decode, which no placement shortens)
        "rest_mean_s": statistics.fmean(lat - ttft for lat, ttft in zip(latencies, ttfts, strict=True)),
        # the agents' first turns (misses under any placement) apart from the later ones
        "ttft_mean_first_s": _mean(ttfts, first),
        "ttft_mean_later_s": _mean(ttfts, later),
        "latency_mean_first_s": _mean(latencies, first),
        "latency_mean_later_s": _mean(latencies, later),
        # when the last first turn ended: from then on every request may find its prompt cached
        "first_turns_end_s": first_end,
        "running_later": running_later,
        "flood": len(flood),
        "flood_makespan_s": flood_makespan,
        "prefix_hit_rate": hits,
        "expected_hit_rate": expected,
        "idle_fraction": idle,
        "idle_with_work_fraction": idle_held,
        "per_engine": per_engine if via is None else None,
        "preempted": preempted,
        "agents_queued_mean_s": queued,
        "held_not_run_mean": unrun,
        "engine_waiting_mean": queued_in_engine,
        "turns_cached": sum(hit) if said else None,
        "ttft_p50_cached_s": _p50(ttfts, hit) if said else None,
        "ttft_p50_uncached_s": _p50(ttfts, [not h for h in hit]) if said else None,
    }


def _p50(values: list[float], which: list[bool]) -> float | None:
    picked = [v for v, w in zip(values, which, strict=True) if w]
    return statistics.median(picked) if picked else None


def _mean(values: list[float], which: list[bool]) -> float | None:
    picked = [v for v, w in zip(values, which, strict=True) if w]
    return statistics.fmean(picked) if picked else None


def main(argv: list[str] | None = None) -> int:
    ap = engine_parser(__doc__)
    ap.add_argument("--agents", type=int, default=60)
    ap.add_argument("--requests", type=int, default=240)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--prompt-words", type=int, default=560)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument(
        "--order",
        choices=("rounds", "cyclic", "random"),
        default="rounds",
        help="which agent each request is of",
    )
    ap.add_argument(
        "--kv-share",
        type=float,
        default=0.7,
        help="each engine's KV cache, as a share of the agents' system prompts together "
        "(default 0.7: more than one engine holds, less than two do); 0: vLLM's own size",
    )
    ap.add_argument(
        "--kv-tokens", type=int, default=0, help="each engine's KV cache in tokens (over --kv-share)"
    )
    ap.add_argument("--modes", default="round-robin,laneway-rr,laneway")
    ap.add_argument("--flood", type=int, default=0, help="batch requests sent at once beside the agents")
    ap.add_argument("--flood-tokens", type=int, default=256)
    ap.add_argument("--flood-words", type=int, default=300)
    ap.add_argument(
        "--priority", action="store_true", help="engines order by priority; laneway tells them each class"
    )
    ap.add_argument("--json", type=Path, metavar="FILE")
    ap.add_argument(
        "--logs", type=Path, metavar="DIR", help="keep the engines' logs and laneway's (a line a request)"
    )
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    known = {"round-robin", "least-loaded", "laneway-rr", "laneway", "laneway-isolated", "laneway-no-guard"}
    bad = sorted(set(modes) - known)
    if bad:
        ap.error(f"unknown mode {bad[0]!r}")
    bodies = workload(args.agents, args.requests, args.prompt_words, args.tokens, args.order)
    total = prompt_tokens(Path(args.model), bodies)
    if not args.kv_tokens and args.kv_share > 0:
        args.kv_tokens = round(total * args.kv_share)
    if args.kv_tokens and args.kv_tokens < VLLM_MAX_MODEL_LEN:  # (vLLM would not start)
        ap.error(
            f"each engine's KV cache would hold {args.kv_tokens:,} tokens, under its longest request "
            f"({VLLM_MAX_MODEL_LEN:,}): more --agents or --prompt-words, a larger --kv-share or --kv-tokens, "
            "or --kv-share 0 (vLLM's own size)"
        )
    err.print(
        f"[dim]the agents' system prompts: {total:,} tokens together; each engine's KV cache: "
        + (f"{args.kv_tokens:,} tokens[/]" if args.kv_tokens else "vLLM's own size[/]")
    )
    batch = flood_bodies(args.flood, args.flood_words, args.flood_tokens)
    if batch:  # the P0 idle reference: the agents alone through laneway
        unguarded = ["laneway-no-guard (idle)"] if "laneway-no-guard" in modes else []
        modes = ["laneway (idle)", *unguarded, *modes]
    results = []
    with contextlib.ExitStack() as keep:
        if args.logs is not None:  # (kept: the engines' and laneway's logs of each mode)
            args.logs.mkdir(parents=True, exist_ok=True)
            tmp = args.logs
        else:
            tmp = Path(keep.enter_context(tempfile.TemporaryDirectory(prefix="routing-bench-")))
        with engines(args, tmp) as eng:
            for mode in modes:
                eng.reset()
                eng.samples = [[] for _ in eng.urls]
                eng.held = [[] for _ in eng.urls]
                eng.waiting = [[] for _ in eng.urls]
                eng.at = []
                err.print(f"[dim]{mode}: {len(bodies)} requests from {args.clients} clients…[/]")
                flood = [] if mode.endswith("(idle)") else batch
                if mode.startswith("laneway"):
                    placement = "round-robin" if mode == "laneway-rr" else None
                    here = tmp / mode.replace(" ", "-")
                    isolate = mode == "laneway-isolated"
                    guard = not mode.startswith("laneway-no-guard")
                    with gateway(here, eng.urls, args.slots, placement, args.priority, isolate, guard) as via:
                        results.append(asyncio.run(run(mode, bodies, eng, via, args.clients, flood)))
                else:
                    results.append(asyncio.run(run(mode, bodies, eng, None, args.clients, flood)))
                err.print(f"[dim]  {progress_line(results[-1])}[/]")
    Console().print(table(args, total, bool(batch), results))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args), "runs": results}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    exit_on_sigterm()  # (the engines it started stop with it)
    sys.exit(main())
