"""Built-in workloads, generated from a seed (same seed, same requests).

- ``chat-vs-batch``: 4 slots. 200 P2 batch jobs of ~10 s submitted at t=0 as
  one batch (their timeout is the batch window, 24 h), then P0 chat requests of
  1–3 s arriving as a Poisson stream (3 a minute) for 10 minutes.
- ``code-review``: 8 GPUs. ~1,000 P2 reviews over a 3-hour morning whose
  arrival rate peaks well above capacity mid-morning (FIFO: mean wait ~3.7
  min); review times 15–120 s, heavy-tailed (log-normal, median ~16 s, p99
  120 s); each review announces its size as output tokens (like
  ``max_tokens``) within +-30 % of the truth; 5 P0 hotfix reviews inside the
  peak. Reviews may queue for an hour (their service level), hotfixes 5 min.
- ``mixed``: 8 slots, all four classes as Poisson streams, one busy hour
  (~105% of capacity) then one quiet hour (~40%). ``requests=N`` scales the
  arrival rates and the slot count together to reach about N requests.
- ``support-desk``: 16 slots, two hours of a support desk. P0 chat of 1–12 s
  (~0.4/s, with three 10-minute bursts at 1/s), P1 API calls of 1–50 s
  (~2 a minute), four P2 batches of 500–800 jobs of 10–40 s each arriving at
  once (at 0, 30, 60 and 90 minutes; their window is a day) and eight P3
  analytics jobs of 100–300 s; batch and analytics jobs announce their size
  (output tokens, within +-30 % of the truth, like ``max_tokens``). P0 + P1
  need ~4 of the 16 slots; the rest is batch work that P0 preempts, again and
  again.
- ``two-tenants``: 8 slots, one hour of P2 work from two tenants of one class:
  ``big`` sends ten times as much as ``small`` (5–40 s each), together ~1.2x
  capacity. Inside the class, tenants share by tokens (token-fair), so
  ``small`` waits for its own work, not ``big``'s; compare with
  ``--no-fair-tenants`` (FIFO inside the class).
- ``cold-start``: 16 slots, one hour that begins cold: 50 long P3 analytics jobs
  (2–10 min, no size announced) at t=0, P0 chat (1–8 s, ~0.3/s) and P1 API
  calls (2–30 s, ~3 a minute) throughout, and three P2 batches of 150 jobs
  (10–40 s, sized like ``max_tokens`` within +-30 %) at 10, 25 and 40 minutes.
  Nothing has finished when the first estimates are asked: what the P3 jobs
  will take is not known until some end.
- ``gpu-mix``: a GPU fleet (4 x 80 GB in one node, 4 x 24 GB in another) with
  a 7B chat model (14 GB), a 13B (26 GB) and a 70B (140 GB on 4 GPUs); loads
  take 30-60 s. For an hour: P0 chat on the 7B model, P2 batch on all three.
- ``agents``: 32 upstreams (engines of 8 slots with prefix caching, 262,144 tokens of
  KV space each) and 2,000 agents starting over 20 minutes, each one session of 6-20 P1 turns
  10-20 s apart: its own system prompt of 2,000-8,000 tokens, then each turn adds a
  tool result or user message (32-320 tokens) and the agent's reply (30-120 tokens).
  At 5 minutes a flood of 3,000 P3 jobs (a shared 1,024-token instruction, a document
  of 1,000-5,000 tokens, 200-400 tokens out). The ~300 agents active at a time hold
  ~2.3 M tokens of prompt: 9 engines' KV space, a quarter of all 32's. Where a turn
  runs decides whether its prompt is prefilled again (engines prefill one prompt at a
  time; :mod:`laneway.sim.engines`). Compare ``--policy laneway,round-robin,least-loaded``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from laneway.core.inventory import Inventory
from laneway.core.workers import WorkerSpec
from laneway.sim.agents import AGENT_KV_TOKENS, agent_requests
from laneway.sim.workload import DAY_S, SimRequest


@dataclass(frozen=True)
class Scenario:
    name: str
    requests: list[SimRequest]
    slots: int
    description: str | None
    inventory: Inventory | None = None  # a GPU fleet instead of plain slots
    workers: tuple[WorkerSpec, ...] | None = None  # upstreams of several slots instead
    caches: bool = False  # ... whose engines keep a prefix cache (laneway.sim.engines)


def _poisson(rng: random.Random, rate: float, start: float, end: float) -> list[float]:
    out = []
    t = start + rng.expovariate(rate)
    while t < end:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def chat_vs_batch(seed: int = 0, chat_per_min: float = 3.0) -> Scenario:
    rng = random.Random(seed)
    reqs = [
        SimRequest(f"batch-{i}", 0.0, 2, rng.uniform(8.0, 12.0), timeout_s=DAY_S, prompt_tokens=1500)
        for i in range(200)
    ]
    for i, t in enumerate(_poisson(rng, chat_per_min / 60.0, 0.0, 600.0)):
        reqs.append(SimRequest(f"chat-{i}", t, 0, rng.uniform(1.0, 3.0), prompt_tokens=300))
    return Scenario("chat-vs-batch", reqs, 4, "200 x 10 s P2 batch at t=0 + P0 chat stream, 4 slots")


def _review_time(rng: random.Random) -> float:
    return min(120.0, max(15.0, rng.lognormvariate(math.log(16.0), 1.2)))


HINT_TOKENS_S = 30.0  # announced sizes are in tokens at this decode speed
HINT_ERROR = 0.3  # ... off from the true work by up to this share, either way


def _hint_tokens(rng: random.Random, duration_s: float) -> int:
    """Output tokens a client announces (its ``max_tokens``-like size): the true
    work within +-30 %, at 30 tokens/s of decode."""
    return max(1, round(duration_s * HINT_TOKENS_S * rng.uniform(1 - HINT_ERROR, 1 + HINT_ERROR)))


def code_review(seed: int = 0, reviews: int = 1000) -> Scenario:
    rng = random.Random(seed)
    span = 3 * 3600.0
    peak, width, base = 1.4 * 3600.0, 0.3 * 3600.0, 0.05

    def shape(t: float) -> float:
        return base + math.exp(-(((t - peak) / width) ** 2))

    # thinning: draw a Poisson stream at the top rate, keep each with shape/top
    top = 1.0 + base
    area = sum(shape(t) for t in range(0, int(span), 10)) * 10.0
    arrivals = [t for t in _poisson(rng, reviews / area * top, 0.0, span) if rng.random() < shape(t) / top]

    def review(name: str, t: float, cls: int, duration: float, timeout_s: float, prompt: int) -> SimRequest:
        hint = _hint_tokens(rng, duration)
        return SimRequest(
            name, t, cls, duration, timeout_s=timeout_s, prompt_tokens=prompt, output_tokens=hint
        )

    reqs = [review(f"review-{i}", t, 2, _review_time(rng), 3600.0, 6000) for i, t in enumerate(arrivals)]
    for i in range(5):
        t = rng.uniform(peak - width, peak + width)
        reqs.append(review(f"hotfix-{i}", t, 0, rng.uniform(15.0, 40.0), 300.0, 3000))
    return Scenario("code-review", reqs, 8, f"{len(reqs)} reviews (5 P0 hotfixes) on 8 GPUs")


_MIX = (  # class, share of requests, duration range (s), prompt tokens
    (0, 0.30, (1.0, 3.0), 300),
    (1, 0.30, (2.0, 8.0), 800),
    (2, 0.25, (10.0, 30.0), 2000),
    (3, 0.15, (20.0, 60.0), 4000),
)


_HOURS = ((0.0, 1.05), (3600.0, 0.4))  # (start, offered load as a share of capacity)


def mixed(seed: int = 0, requests: int | None = None) -> Scenario:
    rng = random.Random(seed)
    slots = 8
    mean_work = sum(share * (lo + hi) / 2 for _, share, (lo, hi), _ in _MIX)
    capacity = slots / mean_work  # requests per second the slots can serve
    base = sum(load for _, load in _HOURS) * capacity * 3600.0
    scale = 1.0 if requests is None else max(requests / base, 1e-6)
    capacity *= scale  # rates follow the exact scale; the slot count is rounded
    slots = max(1, round(slots * scale))
    drawn: list[tuple[float, int, float, int]] = []
    for start, load in _HOURS:
        for cls, share, (lo, hi), prompt in _MIX:
            for t in _poisson(rng, load * capacity * share, start, start + 3600.0):
                drawn.append((t, cls, rng.uniform(lo, hi), prompt))
    drawn.sort(key=lambda d: d[0])
    named = [
        SimRequest(f"m{i}", t, cls, duration, prompt_tokens=prompt)
        for i, (t, cls, duration, prompt) in enumerate(drawn)
    ]
    return Scenario(
        "mixed", named, slots, f"{len(named)} requests, 4 classes, busy + quiet hour, {slots} slots"
    )


_DESK_BURSTS = (1200.0, 3900.0, 6000.0)  # starts of the 10-minute P0 bursts
DESK_SIZES_S = ((1.0, 12.0), (1.0, 50.0), (10.0, 40.0), (100.0, 300.0))  # per class: uniform


def support_desk(seed: int = 0) -> Scenario:
    rng = random.Random(seed)
    end = 2 * 3600.0
    drawn: list[tuple[float, str, int, float, float | None, int]] = []
    chat = _poisson(rng, 0.4, 0.0, end)
    for start in _DESK_BURSTS:
        chat += _poisson(rng, 0.6, start, start + 600.0)  # (on top: 1/s in all)
    for t in chat:
        drawn.append((t, "chat", 0, rng.uniform(*DESK_SIZES_S[0]), None, 400))
    for t in _poisson(rng, 2 / 60.0, 0.0, end):
        drawn.append((t, "api", 1, rng.uniform(*DESK_SIZES_S[1]), None, 1200))
    for b, start in enumerate((0.0, 1800.0, 3600.0, 5400.0)):
        for _ in range(rng.randint(500, 800)):
            drawn.append((start, f"batch{b}", 2, rng.uniform(*DESK_SIZES_S[2]), DAY_S, 2000))
    for t in sorted(rng.uniform(0.0, end - 600.0) for _ in range(8)):
        drawn.append((t, "analytics", 3, rng.uniform(*DESK_SIZES_S[3]), None, 6000))
    drawn.sort(key=lambda d: d[0])
    reqs = [  # batch and analytics jobs announce their size (max_tokens), +-30 %; chat does not
        SimRequest(
            f"{name}-{i}",
            t,
            cls,
            duration,
            timeout_s=timeout,
            prompt_tokens=prompt,
            output_tokens=_hint_tokens(rng, duration) if cls >= 2 else 0,
        )
        for i, (t, name, cls, duration, timeout, prompt) in enumerate(drawn)
    ]
    return Scenario(
        "support-desk",
        reqs,
        16,
        f"{len(reqs)} requests: P0 chat with bursts, P1 API, 4 P2 batches at once, P3 analytics; 16 slots",
    )


def cold_start(seed: int = 0) -> Scenario:
    rng = random.Random(seed)
    end = 3600.0
    reqs = [
        SimRequest(f"analytics-{i}", 0.0, 3, rng.uniform(120.0, 600.0), prompt_tokens=4000) for i in range(50)
    ]
    for i, t in enumerate(_poisson(rng, 0.3, 0.0, end)):
        reqs.append(SimRequest(f"chat-{i}", t, 0, rng.uniform(1.0, 8.0), prompt_tokens=400))
    for i, t in enumerate(_poisson(rng, 3 / 60.0, 0.0, end)):
        reqs.append(SimRequest(f"api-{i}", t, 1, rng.uniform(2.0, 30.0), prompt_tokens=1200))
    for b, start in enumerate((600.0, 1500.0, 2400.0)):
        for j in range(150):
            duration = rng.uniform(10.0, 40.0)
            reqs.append(
                SimRequest(
                    f"batch{b}-{j}",
                    start,
                    2,
                    duration,
                    timeout_s=DAY_S,
                    prompt_tokens=2000,
                    output_tokens=_hint_tokens(rng, duration),
                )
            )
    reqs.sort(key=lambda r: r.arrival_s)
    return Scenario(
        "cold-start", reqs, 16, "50 long P3 jobs at t=0, P0/P1 chat, 3 sized P2 batches; 16 slots"
    )


def two_tenants(seed: int = 0) -> Scenario:
    rng = random.Random(seed)
    slots, end = 8, 3600.0
    mean_s = 22.5
    rate = 1.2 * slots / mean_s  # requests per second, both tenants together
    drawn: list[tuple[float, str]] = []
    for tenant, share in (("big", 10 / 11), ("small", 1 / 11)):
        drawn += [(t, tenant) for t in _poisson(rng, rate * share, 0.0, end)]
    drawn.sort()
    reqs = []
    for i, (t, tenant) in enumerate(drawn):
        duration = rng.uniform(5.0, 40.0)
        reqs.append(
            SimRequest(
                f"{tenant}-{i}",
                t,
                2,
                duration,
                tenant=tenant,
                timeout_s=DAY_S,
                prompt_tokens=1000,
                output_tokens=_hint_tokens(rng, duration),
            )
        )
    return Scenario(
        "two-tenants", reqs, slots, f"{len(reqs)} P2 requests, tenant big sends 10x small, ~1.2x capacity"
    )


def gpu_fleet() -> Inventory:
    """Node ``a``: 4 x 80 GB; node ``b``: 4 x 24 GB; 10 % of each GPU kept for KV cache.
    A 7B chat model (14 GB), a 13B model (26 GB) and a 70B model (140 GB over the
    4 GPUs of one node); loads take 30-60 s; the chat model is loaded at start-up."""
    return Inventory.from_dict(
        {
            "nodes": {
                "a": {"gpus": [{"id": f"a{i}", "vram_gb": 80, "kv_reserve_gb": 8} for i in range(4)]},
                "b": {"gpus": [{"id": f"b{i}", "vram_gb": 24, "kv_reserve_gb": 2.4} for i in range(4)]},
            },
            "models": {
                "chat-7b": {"vram_gb": 14, "load_s": 30, "slots": 8},
                "mid-13b": {"vram_gb": 26, "load_s": 40, "slots": 4},
                "big-70b": {"vram_gb": 140, "gpus": 4, "load_s": 60, "slots": 4},
            },
            "preload": ["chat-7b"],
        }
    )


_GPU_TRAFFIC = (  # name prefix, class, model, arrivals per second, duration range (s), prompt tokens
    ("chat", 0, "chat-7b", 0.5, (1.0, 3.0), 300),
    ("batch7", 2, "chat-7b", 0.1, (5.0, 20.0), 1500),
    ("batch13", 2, "mid-13b", 0.1, (10.0, 30.0), 2000),
    ("batch70", 2, "big-70b", 0.05, (20.0, 60.0), 3000),
)


def gpu_mix(seed: int = 0, hours: float = 1.0) -> Scenario:
    rng = random.Random(seed)
    end = hours * 3600.0
    drawn: list[tuple[float, str, int, str, float, int]] = []
    for prefix, cls, model, rate, (lo, hi), prompt in _GPU_TRAFFIC:
        for t in _poisson(rng, rate, 0.0, end):
            drawn.append((t, prefix, cls, model, rng.uniform(lo, hi), prompt))
    drawn.sort(key=lambda d: d[0])
    reqs = [
        SimRequest(
            f"{prefix}-{i}",
            t,
            cls,
            duration,
            model=model,
            timeout_s=None if cls == 0 else DAY_S,  # batch lines queue for their window
            prompt_tokens=prompt,
        )
        for i, (t, prefix, cls, model, duration, prompt) in enumerate(drawn)
    ]
    return Scenario(
        "gpu-mix",
        reqs,
        8,
        f"{len(reqs)} requests: P0 chat + P2 batch on 7B/13B/70B models, 4 x 80 GB + 4 x 24 GB GPUs",
        gpu_fleet(),
    )


def agents(
    seed: int = 0, upstreams: int = 32, count: int = 2000, kv_tokens: int = AGENT_KV_TOKENS
) -> Scenario:
    reqs = agent_requests(seed, count)
    jobs = count * 3 // 2  # (the flood's jobs)
    workers = tuple(WorkerSpec(f"u{i}", 8, kv_tokens=kv_tokens) for i in range(upstreams))
    return Scenario(
        "agents",
        reqs,
        8 * upstreams,
        f"{count} agents (P1, long system prompts, multi-turn) + {jobs} P3 jobs on {upstreams} upstreams"
        " with prefix caches",
        workers=workers,
        caches=True,
    )


SCENARIOS: dict[str, Callable[..., Scenario]] = {
    "chat-vs-batch": chat_vs_batch,
    "code-review": code_review,
    "mixed": mixed,
    "support-desk": support_desk,
    "two-tenants": two_tenants,
    "cold-start": cold_start,
    "gpu-mix": gpu_mix,
    "agents": agents,
}


def scenario(name: str, seed: int = 0, **params: int) -> Scenario:
    try:
        make = SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}: choose one of {', '.join(SCENARIOS)}") from None
    return make(seed, **params)
