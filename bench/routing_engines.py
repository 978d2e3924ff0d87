"""The two vLLM engines of ``routing_bench.py``: started one a core, their prefix caches
emptied between runs, their counters read, what each runs sampled every 0.25 s."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from rich.console import Console

from agents_workload import MODEL
from laneway.testing import vllm_process

BLOCK = 128  # tokens a KV block of vLLM's CPU build holds
err = Console(stderr=True)


class Engines:
    """The two engines: their URLs, metrics and the sampler of their running counts."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.samples: list[list[float]] = [[] for _ in urls]
        self.held: list[list[float]] = [[] for _ in urls]
        self.waiting: list[list[float]] = [[] for _ in urls]  # (in the engine's own queue)
        self.at: list[float] = []  # (when each sample was taken: perf_counter)

    def root(self, i: int) -> str:
        return self.urls[i].removesuffix("/v1")

    def reset(self) -> None:
        for i in range(len(self.urls)):
            r = httpx.post(self.root(i) + "/reset_prefix_cache", timeout=30)
            r.raise_for_status()

    def counters(self) -> list[dict[str, float]]:
        out = []
        for i in range(len(self.urls)):
            text = httpx.get(self.root(i) + "/metrics", timeout=30).text
            row = {}
            for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
                row[name] = sum(float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M))
            out.append(row)
        return out

    async def sample(
        self, client: httpx.AsyncClient, stop: asyncio.Event, via: str | None, in_flight: list[int]
    ) -> None:
        """Every 0.25 s: what each engine runs, and what was sent it (``self.held``: through
        laneway what laneway has there, else the client's ``in_flight``), so that work sent
        and not run shows."""
        pattern = re.compile(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", re.M)
        waiting = re.compile(r"^vllm:num_requests_waiting\{[^}]*\} (\S+)$", re.M)
        busy = re.compile(r'^laneway_worker_slots_busy\{worker="up(\d+)"\} (\S+)$', re.M)
        for _ in range(100_000):
            if stop.is_set():
                return
            with contextlib.suppress(httpx.HTTPError):
                if via is not None:
                    text = (await client.get(via.removesuffix("/v1") + "/metrics", timeout=5)).text
                    got = {int(k): float(v) for k, v in busy.findall(text)}
                    sent = [got.get(i, 0.0) for i in range(len(self.urls))]
                else:
                    sent = [float(n) for n in in_flight]
                got_all = []
                for i in range(len(self.urls)):
                    text = (await client.get(self.root(i) + "/metrics", timeout=5)).text
                    running = sum(float(v) for v in pattern.findall(text))
                    got_all.append((running, sum(float(v) for v in waiting.findall(text))))
                # (all of a sample or none of it: the lists stay aligned if a scrape fails)
                for i, (v, w) in enumerate(got_all):
                    self.held[i].append(sent[i])
                    self.samples[i].append(v)
                    self.waiting[i].append(w)
                self.at.append(time.perf_counter())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)


@contextlib.contextmanager
def engines(args: argparse.Namespace, tmp: Path) -> Iterator[Engines]:
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # (for /reset_prefix_cache)
    extra: tuple[str, ...] = (
        "--served-model-name",
        MODEL,
        "--max-num-seqs",
        str(args.slots),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",  # (each answer's usage says how much of its prompt was cached)
    )
    if args.kv_tokens:  # (vLLM's CPU build: blocks of 128 tokens)
        extra += ("--block-size", str(BLOCK), "--num-gpu-blocks-override", str(-(-args.kv_tokens // BLOCK)))
    if args.priority:
        extra += ("--scheduling-policy", "priority")
    with contextlib.ExitStack() as stack:
        urls = []
        for i in range(2):
            err.print(f"[dim]starting vLLM {i} on core {i}…[/]")
            v = stack.enter_context(
                vllm_process(Path(args.vllm), Path(args.model), tmp / f"vllm{i}.log", *extra, cpus=str(i))
            )
            urls.append(v.url)
        yield Engines(urls)
