"""A long prompt is prefilled a chunk (``PREFILL_CHUNK`` tokens) a step: a short prompt that
joins meanwhile makes its first token in the next step, the running sequences go on
decoding between the chunks, and a preemption or a cancel comes between two chunks — not
after the whole prompt (on a CPU, seconds or minutes of an urgent request's wait)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from laneway.engine.engine import PREFILL_CHUNK, Engine
from laneway.generation import Delta, Done, Stopped

from .helpers import Collector, alone, greedy, job, run_all

LONG = "hello world " * 150  # (1,800 tokens of builtin:tiny: four chunks)


def test_a_long_prompt_is_prefilled_over_several_steps_beside_decodes_and_a_short_prompt(
    engine: Engine,
) -> None:
    want = alone(engine, job("ref", LONG, greedy(8)))
    col = Collector()
    engine.add(job("runner", "count with me", greedy(40)), col.sink("runner"))
    engine.step()  # (it joins and makes its first token)
    engine.add(job("long", LONG, greedy(8)), col.sink("long"))
    chunks = math.ceil(len(engine.by_id["long"].ids) / PREFILL_CHUNK)
    assert chunks >= 3
    engine.step()  # (the long prompt's first chunk, and a decode step of the runner)
    made = engine.by_id["runner"].generated
    assert made == 2 and engine.by_id["long"].kv_len == PREFILL_CHUNK
    engine.add(job("short", "hi", greedy(8)), col.sink("short"))
    engine.step()  # (the short prompt first: it is prefilled whole and makes its first token)
    assert [e for e in col.events["short"] if isinstance(e, Delta)]
    assert not col.events.get("long")  # (the long one is still being prefilled)
    for _ in range(chunks):
        engine.step()
    assert engine.by_id["runner"].generated > made + 1  # (it decoded between the chunks)
    run_all(engine, col)
    assert col.done("long").text == want.text  # (the same as prefilled at once)
    assert col.done("long").usage.prompt_tokens == want.usage.prompt_tokens


@pytest.mark.parametrize("mode", ["checkpoint", "recompute"])
def test_a_long_prefill_is_preempted_between_chunks_and_resumes_exactly(engine: Engine, mode: str) -> None:
    want = alone(engine, job("ref", LONG, greedy(8)))
    col = Collector()
    engine.add(job("long", LONG, greedy(8)), col.sink("long"))
    engine.step()
    assert 0 < engine.by_id["long"].kv_len < len(engine.by_id["long"].ids)
    ckpt = engine.preempt("long", mode)
    assert ckpt is not None and ckpt.tokens_done == 0 and ckpt.nbytes == 0
    assert isinstance(col.events["long"][-1], Stopped) and not engine.joining and not engine.by_id
    engine.resume(ckpt, col.sink("long"))
    run_all(engine, col)
    assert col.done("long").text == want.text


def test_a_long_prefill_is_cancelled_between_chunks(engine: Engine) -> None:
    col = Collector()
    engine.add(job("long", LONG, greedy(8)), col.sink("long"))
    engine.step()
    assert engine.cancel("long")
    done = col.events["long"][-1]
    assert isinstance(done, Done) and done.finish_reason == "cancelled" and done.usage.completion_tokens == 0
    assert not engine.joining and not engine.by_id and not engine.has_work


def test_a_less_urgent_prompt_waits_while_more_urgent_work_runs_here(engine: Engine) -> None:
    """``Job.rank``: a batch prompt's chunks wait while an urgent sequence runs or joins, so
    that each urgent token costs a decode step, not a chunk of the batch prompt."""
    want = alone(engine, job("ref", LONG, greedy(8)))
    col = Collector()
    engine.add(replace(job("batch", LONG, greedy(8)), rank=3), col.sink("batch"))
    engine.step()
    done = engine.by_id["batch"].kv_len
    assert 0 < done < len(engine.by_id["batch"].ids)
    engine.add(replace(job("urgent", "hi", greedy(6)), rank=0), col.sink("urgent"))
    for _ in range(100):
        if "urgent" not in engine.by_id:
            break
        engine.step()
        assert engine.by_id["batch"].kv_len == done  # (not one more chunk meanwhile)
    assert col.done("urgent").usage.completion_tokens == 6
    run_all(engine, col)
    assert col.done("batch").text == want.text
