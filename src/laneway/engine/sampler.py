"""Picking the next token from a row of logits.

Greedy is ``argmax``. Sampling uses the request's own ``torch.Generator``
(seeded from ``seed`` when given), so a seeded request gives the same text
every time and its generator state can be checkpointed and restored.
"""

from __future__ import annotations

import torch

from laneway.generation import SamplingParams


def new_generator(params: SamplingParams) -> torch.Generator | None:
    if params.greedy:
        return None
    gen = torch.Generator(device="cpu")
    if params.seed is not None:
        gen.manual_seed(params.seed)
    else:
        gen.seed()
    return gen


def sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> int:
    """One token id from a 1-D row of logits (any device)."""
    if gen is None:
        return int(logits.argmax())
    row = logits.detach().to("cpu", torch.float32) / params.temperature
    probs = torch.softmax(row, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of the tokens ranked above
        sorted_p[before >= params.top_p] = 0.0  # keep the smallest set reaching top_p
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return int(torch.multinomial(probs, 1, generator=gen))
