"""Picking the next token from a row of logits.

:func:`adjust` applies what the request asks of the distribution before a
token is picked: ``logit_bias``, the repetition penalty (over prompt and
output, dividing positive logits and multiplying negative ones), presence
and frequency penalties (over the output), and, before ``min_tokens``, no
end of text. :func:`sample` then picks: greedy is ``argmax``; sampling
scales by the temperature, keeps ``top_k``, ``top_p`` and ``min_p``, and
draws with the request's own ``torch.Generator`` (seeded from ``seed`` when
given), so a seeded request gives the same text every time and its
generator state can be checkpointed and restored.

No request can break the sampler: a temperature under
:data:`~laneway.generation.GREEDY_BELOW` is greedy (dividing by it would
overflow), and a row that is not a finite distribution after the
adjustments falls back to the most likely token of the model's own row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from laneway.generation import SamplingParams, TokenLogprob

NEG_INF = float("-inf")


def new_generator(params: SamplingParams) -> torch.Generator | None:
    if params.greedy:
        return None
    gen = torch.Generator(device="cpu")
    if params.seed is not None:
        gen.manual_seed(generator_seed(params.seed))
    else:
        gen.seed()
    return gen


def generator_seed(seed: int) -> int:
    """What a request's 64-bit ``seed`` seeds torch's CPU generator with. That generator keeps
    a seed's low 32 bits only (1 and 2^32 + 1 would draw alike), so a seed past 2^32 is mixed
    down to 32 bits (SplitMix64's finaliser); a seed in [0, 2^32) is taken as it is. (A
    negative seed is the one 2^64 above it, as torch takes it.)"""
    s = seed % (1 << 64)
    if s >> 32 == 0:
        return s
    s = ((s ^ (s >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    s = ((s ^ (s >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (s ^ (s >> 31)) & 0xFFFFFFFF


def adjusts(params: SamplingParams) -> bool:
    """Whether :func:`adjust` has anything to do for ``params`` (past ``min_tokens``)."""
    return bool(
        params.logit_bias
        or params.repetition_penalty != 1.0
        or params.presence_penalty
        or params.frequency_penalty
    )


def adjust(
    logits: torch.Tensor,
    params: SamplingParams,
    prompt: Sequence[int],
    output: Sequence[int],
    blocked: Sequence[int] = (),
) -> torch.Tensor:
    """``logits`` (1-D) adjusted as the request asks; ``blocked`` ids can not be picked."""
    row = logits.detach().to("cpu", torch.float32).clone()
    vocab = row.shape[0]
    for token, bias in params.logit_bias:
        if token < vocab:
            row[token] += bias
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted({t for t in (*prompt, *output) if t < vocab}), dtype=torch.long)
        if len(seen):
            vals = row[seen]
            penalty = params.repetition_penalty
            row[seen] = torch.where(vals > 0, vals / penalty, vals * penalty)
    if (params.presence_penalty or params.frequency_penalty) and output:
        ids = torch.tensor([t for t in output if t < vocab], dtype=torch.long)
        counts = torch.bincount(ids, minlength=vocab).to(torch.float32)
        row -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(torch.float32)
    for token in blocked:
        if token < vocab:
            row[token] = NEG_INF
    return row


def sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> int:
    """One token id from a 1-D row of logits (any device)."""
    if gen is None or params.greedy:
        return _argmax(logits)
    row = logits.detach().to("cpu", torch.float32) / params.temperature
    if params.top_k > 0 and params.top_k < row.shape[0]:
        kth = torch.topk(row, params.top_k).values[-1]
        row = row.masked_fill(row < kth, NEG_INF)
    probs = torch.softmax(row, dim=-1)
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of the tokens ranked above
        cut = before >= params.top_p
        cut[0] = False  # keep the smallest set reaching top_p: the most likely token at least
        sorted_p[cut] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    total = float(probs.sum())
    if not math.isfinite(total) or total <= 0.0 or not bool(torch.isfinite(probs).all()):
        return _argmax(logits)
    return int(torch.multinomial(probs, 1, generator=gen))


def _argmax(logits: torch.Tensor) -> int:
    """The most likely token, ignoring NaN (a row with no number at all gives token 0)."""
    row = torch.nan_to_num(logits.detach().to(torch.float32), nan=NEG_INF)
    return int(row.argmax())


def logprob_of(logits: torch.Tensor, token: int, top: int, piece: Callable[[int], bytes]) -> TokenLogprob:
    """The log-probability of ``token`` under the model's row, and the ``top`` likeliest tokens.

    ``piece(id)`` is a token's bytes.
    """
    row = torch.log_softmax(torch.nan_to_num(logits.detach().to("cpu", torch.float32), nan=NEG_INF), dim=-1)
    alts: tuple[tuple[str, float, tuple[int, ...]], ...] = ()
    if top > 0:
        values, ids = torch.topk(row, min(top, row.shape[0]))
        alts = tuple(_named(piece(int(i)), float(v)) for v, i in zip(values, ids, strict=True))
    name, _, raw = _named(piece(token), float(row[token]))
    return TokenLogprob(name, _finite(float(row[token])), raw, alts)


def _named(raw: bytes, value: float) -> tuple[str, float, tuple[int, ...]]:
    return raw.decode("utf-8", "replace"), _finite(value), tuple(raw)


def _finite(value: float) -> float:
    """JSON has no -inf: an impossible token gets OpenAI's floor."""
    return value if math.isfinite(value) else -9999.0
