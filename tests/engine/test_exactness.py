"""Preempt at a token boundary, resume, and get the uninterrupted text, token for token.

Guarantees: ``checkpoint`` restores the KV cache and the sampler's RNG state,
so the resumed request computes exactly what it would have (greedy and seeded
sampling alike). ``recompute`` re-prefills prompt + generated ids with the RNG
state restored: equal on these cases, but a prefill and step-by-step decoding
may differ in the last float bits, so it is not a bitwise guarantee.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from laneway.engine.engine import Engine
from laneway.engine.models import LoadedModel
from laneway.generation import Done, Job, SamplingParams, Stopped

from .helpers import Collector, alone, greedy, job, run_all

N = 24


def preempted_run(
    engine: Engine, j: Job, at_tokens: list[int], mode: str, others: int = 0
) -> tuple[Done, str, int]:
    """Run ``j`` beside ``others`` other jobs, preempting it once it has made each count in ``at_tokens``."""
    col = Collector()
    engine.add(j, col.sink(j.id))
    for i in range(others):
        engine.add(job(f"other{i}", f"another prompt {i}" * (i + 1), greedy(N + 10)), col.sink(f"other{i}"))
    pending = list(at_tokens)
    preemptions = 0
    for _ in range(10_000):
        if j.id not in engine.by_id:
            break
        seq = engine.by_id[j.id]
        if pending and seq.generated >= pending[0]:
            assert seq.generated == pending.pop(0)
            ckpt = engine.preempt(j.id, mode)
            assert ckpt is not None and ckpt.mode == mode
            assert isinstance(col.events[j.id][-1], Stopped)
            preemptions += 1
            engine.step()  # the others go on without it
            engine.resume(ckpt, col.sink(j.id))
            continue
        engine.step()
    run_all(engine, col)
    return col.done(j.id), col.streamed(j.id), preemptions


@pytest.mark.parametrize("mode", ["checkpoint", "checkpoint-on-disk", "recompute"])
@pytest.mark.parametrize("points", [[1], [N // 2], [N - 1], [1, N // 2, N - 1]])
def test_greedy_preempted_matches_uninterrupted(
    tiny: LoadedModel, tmp_path: Path, mode: str, points: list[int]
) -> None:
    budget = 0 if mode == "checkpoint-on-disk" else 1 << 30  # 0: every checkpoint is spilled to a file
    engine = Engine(tiny, slots=4, data_dir=tmp_path, spill_budget_bytes=budget)
    mode = mode.removesuffix("-on-disk")
    j = job("a", "The quick brown fox")
    ref = alone(engine, j)
    assert ref.usage.completion_tokens == N
    done, streamed, count = preempted_run(engine, j, points, mode)
    assert count == len(points)
    assert engine.store.spills == (count if budget == 0 else 0)
    assert done.text == ref.text
    assert streamed == ref.text  # nothing streamed twice or lost across the preemption
    assert done.usage == ref.usage


@pytest.mark.parametrize("mode", ["checkpoint", "recompute"])
def test_greedy_preempted_in_a_busy_batch(engine: Engine, mode: str) -> None:
    j = job("a", "batched")
    ref = alone(engine, j)
    done, streamed, _ = preempted_run(engine, j, [3, 11, 20], mode, others=3)
    assert done.text == ref.text == streamed


@pytest.mark.parametrize("mode", ["checkpoint", "recompute"])
def test_seeded_sampling_resumes_exactly(engine: Engine, mode: str) -> None:
    params = SamplingParams(max_tokens=N, temperature=0.9, top_p=0.9, seed=42)
    j = job("s", "sample me", params)
    ref = alone(engine, j)
    assert alone(engine, j).text == ref.text  # a fixed seed gives the same text
    done, streamed, _ = preempted_run(engine, j, [1, N // 2, N - 1], mode, others=2)
    assert done.text == ref.text == streamed


def test_checkpoint_spilled_to_disk_resumes_exactly(tiny: LoadedModel, tmp_path: Path) -> None:
    engine = Engine(tiny, slots=2, data_dir=tmp_path, spill_budget_bytes=0)  # every checkpoint goes to disk
    j = job("d", "spill me")
    ref = alone(engine, j)
    col = Collector()
    engine.add(j, col.sink("d"))
    for _ in range(5):
        engine.step()
    ckpt = engine.preempt("d", "checkpoint")
    assert ckpt is not None and ckpt.nbytes > 0
    files = list((tmp_path / "checkpoints").glob("*.pt"))
    assert len(files) == 1 and engine.store.in_memory_bytes == 0
    engine.resume(ckpt, col.sink("d"))
    assert not list((tmp_path / "checkpoints").glob("*.pt"))  # read back and removed
    run_all(engine, col)
    assert col.done("d").text == ref.text == col.streamed("d")


def test_preempt_before_first_step_and_twice_in_a_row(engine: Engine) -> None:
    j = job("e", "early")
    ref = alone(engine, j)
    col = Collector()
    engine.add(j, col.sink("e"))
    ckpt = engine.preempt("e", "checkpoint")  # not prefilled yet: nothing generated
    assert ckpt is not None and ckpt.tokens_done == 0 and ckpt.nbytes == 0
    engine.resume(ckpt, col.sink("e"))
    engine.step()
    ckpt = engine.preempt("e", "checkpoint")
    assert ckpt is not None
    engine.resume(ckpt, col.sink("e"))
    ckpt = engine.preempt("e", "checkpoint")  # restored but not yet rejoined
    assert ckpt is not None and ckpt.nbytes > 0
    engine.resume(ckpt, col.sink("e"))
    run_all(engine, col)
    assert col.done("e").text == ref.text == col.streamed("e")
