"""The built-in engine's sampler: log-probabilities, penalties, logit bias, top-k / min-p,
stop token ids, min_tokens, and no request that can break it."""

from __future__ import annotations

import math

import pytest
import torch

from laneway.engine.engine import Engine
from laneway.engine.sampler import adjust, new_generator, sample
from laneway.generation import Delta, SamplingParams

from .helpers import Collector, alone, greedy, job, run_all


def ids_of(engine: Engine, text: str) -> list[int]:
    return engine.model.tokenizer.encode(text)[1:]  # without the begin-of-text token


def test_logprobs_of_every_token_and_its_alternatives(engine: Engine) -> None:
    done = alone(engine, job("lp", "log probabilities", greedy(20, logprobs=3)))
    [ending] = done.choices
    assert ending.logprobs is not None and len(ending.logprobs) == done.usage.completion_tokens == 20
    for entry in ending.logprobs:
        assert len(entry.top) == 3 and entry.logprob <= 0.0
        values = [lp for _, lp, _ in entry.top]
        assert values == sorted(values, reverse=True)
        assert entry.top[0][0] == entry.token and math.isclose(entry.top[0][1], entry.logprob)  # greedy
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
    assert "".join(e.token for e in ending.logprobs) == done.text  # one byte a token here


def test_logprobs_stream_with_the_deltas_and_survive_a_preemption(engine: Engine) -> None:
    params = greedy(30, logprobs=1)
    ref = alone(engine, job("ref", "resume me", params))
    for mode in ("checkpoint", "recompute"):
        col = Collector()
        engine.add(job("p", "resume me", params), col.sink("p"))
        for _ in range(12):
            engine.step()
        ckpt = engine.preempt("p", mode)
        assert ckpt is not None
        engine.resume(ckpt, col.sink("p"))
        run_all(engine, col)
        done = col.done("p")
        assert done.text == ref.text
        streamed = [lp for e in col.events["p"] if isinstance(e, Delta) for lp in e.logprobs or ()]
        assert [e.token for e in streamed] == [e.token for e in ref.choices[0].logprobs or ()]
        assert done.choices[0].logprobs == tuple(streamed)


def test_adjust_applies_bias_and_penalties_as_vllm_defines_them() -> None:
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, 0.0])
    p = SamplingParams(
        max_tokens=5,
        logit_bias=((4, 10.0),),
        repetition_penalty=2.0,
        presence_penalty=0.5,
        frequency_penalty=0.25,
    )
    row = adjust(logits, p, prompt=[0], output=[1, 1, 3])
    # bias first (token 4: 0 + 10); repetition over prompt + output, dividing positive logits and
    # multiplying negative ones (0: 2/2, 1: -1*2, 3: 3/2); presence and frequency over the output
    expected = torch.tensor([1.0, -2.0 - 0.5 - 0.5, 0.5, 1.5 - 0.5 - 0.25, 10.0])
    assert torch.allclose(row, expected)
    blocked = adjust(logits, SamplingParams(max_tokens=5), [], [], blocked=[3])
    assert blocked[3] == float("-inf") and int(blocked.argmax()) == 0


def test_top_k_one_min_p_one_and_top_p_zero_are_greedy(engine: Engine) -> None:
    plain = alone(engine, job("g", "narrow", greedy(25))).text
    for kw in ({"top_k": 1}, {"min_p": 1.0}, {"top_p": 0.0}):
        sampled = SamplingParams(max_tokens=25, temperature=1.0, seed=9, **kw)  # type: ignore[arg-type]
        assert alone(engine, job("s", "narrow", sampled)).text == plain


def test_logit_bias_and_penalties_change_the_text(engine: Engine) -> None:
    [x] = ids_of(engine, "x")
    biased = alone(engine, job("b", "bias", greedy(12, logit_bias=((x, 100.0),))))
    assert biased.text == "x" * 12
    # a strong frequency penalty: no character may come back while others are left
    varied = alone(engine, job("f", "bias", greedy(30, frequency_penalty=2.0, logit_bias=((x, 5.0),))))
    assert varied.text[0] == "x" and varied.text.count("x") < 5


def test_stop_token_ids_end_the_text_and_min_tokens_holds_them_off(engine: Engine) -> None:
    ref = alone(engine, job("r", "stop at a token", greedy(40))).text
    char = ref[5]
    [tok] = ids_of(engine, char)
    first = ref.index(char)
    done = alone(engine, job("s", "stop at a token", greedy(40, stop_token_ids=(tok,))))
    assert done.finish_reason == "stop" and done.text == ref[: first + 1]  # the stop token's text is kept
    held = alone(engine, job("m", "stop at a token", greedy(40, stop_token_ids=(tok,), min_tokens=first + 3)))
    assert len(held.text) >= first + 3 and char not in held.text[: first + 2]


@pytest.mark.parametrize("temperature", [1e-40, 1e-300, 5e-324, 1e-6])
def test_a_vanishing_temperature_is_greedy_not_a_crash(engine: Engine, temperature: float) -> None:
    plain = alone(engine, job("g", "tiny temperature", greedy(20))).text
    params = SamplingParams(max_tokens=20, temperature=temperature, seed=1)
    assert params.greedy
    assert alone(engine, job("t", "tiny temperature", params)).text == plain


def test_sample_falls_back_to_the_likeliest_token_on_a_broken_row() -> None:
    gen = torch.Generator().manual_seed(0)
    p = SamplingParams(max_tokens=1, temperature=1.0)
    assert sample(torch.tensor([float("nan"), 2.0, float("nan")]), p, gen) == 1
    assert sample(torch.tensor([float("-inf"), float("-inf")]), p, gen) in (0, 1)
    huge = torch.tensor([1e38, -1e38, 3e38])
    assert sample(huge, SamplingParams(max_tokens=1, temperature=1e-4), gen) == 2


def test_seeds_that_differ_only_above_32_bits_draw_differently() -> None:
    """torch's CPU generator keeps a seed's low 32 bits: the high ones are folded in, so
    that 1, 2^32 + 1, 2^33 + 1, 2^63 + 1 and 2^64 - 1 are five seeds, not one; a seed under
    2^32 draws as torch's own seed would (texts seeded before are unchanged)."""

    def draws(seed: int) -> list[float]:
        params = SamplingParams(max_tokens=1, temperature=1.0, seed=seed)
        gen = new_generator(params)
        assert gen is not None
        return torch.rand(4, generator=gen).tolist()

    seeds = (1, (1 << 32) + 1, (1 << 33) + 1, (1 << 63) + 1, (1 << 64) - 1)
    assert len({tuple(draws(s)) for s in seeds}) == 5
    assert draws(-1) == draws((1 << 64) - 1)  # (a negative seed: the one 2^64 above it, as torch)
    plain = torch.Generator().manual_seed(123456789)
    assert draws(123456789) == torch.rand(4, generator=plain).tolist()
