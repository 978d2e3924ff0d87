"""The agents workload (the ``agents`` scenario): many agents with long system prompts in
multi-turn sessions, beside a flood of batch jobs, each prompt a chain of block hashes
(:mod:`laneway.sim.engines` plays the engines that cache them)."""

from __future__ import annotations

import itertools
import math
import random

from laneway.core.prefix_cache import BLOCK_TOKENS
from laneway.sim.workload import DAY_S, SimRequest

AGENT_KV_TOKENS = 262_144  # an engine's KV space: a 7B model with GQA on an 80 GB GPU


def agent_requests(seed: int, count: int) -> list[SimRequest]:
    """``count`` agents' turns (P1) over 20 minutes and ``count * 3 // 2`` P3 jobs at 5 min."""
    rng = random.Random(seed)
    blocks = itertools.count(1)  # each new block of text is a new hash of the chain

    def text(tokens: int) -> tuple[int, ...]:
        return tuple(next(blocks) for _ in range(max(1, tokens // BLOCK_TOKENS)))

    reqs: list[SimRequest] = []
    for a in range(count):
        chain = text(round(math.exp(rng.uniform(math.log(2000), math.log(8000)))))  # its system prompt
        t = rng.uniform(0.0, 1200.0)
        for turn in range(rng.randint(6, 20)):
            chain += text(rng.randint(32, 320))  # a tool result or a user message
            out = rng.randint(30, 120)
            reply = text(out)
            reqs.append(
                SimRequest(
                    f"agent-{a}-{turn}",
                    t,
                    1,
                    None,
                    tenant="agents",
                    prompt_tokens=len(chain) * BLOCK_TOKENS,
                    output_tokens=out,
                    prefix=chain,
                    reply=reply,
                )
            )
            chain += reply
            t += rng.uniform(10.0, 20.0)
    instruction = text(1024)
    jobs = count * 3 // 2
    for i in range(jobs):
        doc = instruction + text(rng.randint(1000, 5000))
        reqs.append(
            SimRequest(
                f"flood-{i}",
                300.0,
                3,
                None,
                tenant="flood",
                timeout_s=DAY_S,
                prompt_tokens=len(doc) * BLOCK_TOKENS,
                output_tokens=rng.randint(200, 400),
                prefix=doc,
            )
        )
    return reqs
