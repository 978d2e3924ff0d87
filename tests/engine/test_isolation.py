"""One request's failure is that request's: the engine fails the requests of a
broken step and goes on; only an engine that breaks step after step stops."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from laneway.engine import engine as engine_module
from laneway.engine.engine import Engine
from laneway.engine.runner import MAX_BROKEN_STEPS, EngineRunner
from laneway.generation import Done, Failed, SamplingParams

from .helpers import Collector, alone, job, run_all


def _sample_failing_for_seed_666(real: Callable[..., int]) -> Callable[..., int]:
    """``sample`` that breaks for the job seeded 666."""

    def fake(row: torch.Tensor, params: Any, gen: Any) -> int:
        if params.seed == 666:
            raise RuntimeError("sampler broke")
        return real(row, params, gen)

    return fake


def test_a_request_whose_sampling_breaks_fails_alone(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    want = alone(engine, job("ref", "one two"))
    monkeypatch.setattr(engine_module, "sample", _sample_failing_for_seed_666(engine_module.sample))
    col = Collector()
    bad = job("bad", "x", SamplingParams(max_tokens=8, temperature=1.0, seed=666))
    for j in (job("a", "one two"), bad, job("b", "one two")):
        engine.add(j, col.sink(j.id))
    run_all(engine, col)
    last = col.events["bad"][-1]
    assert isinstance(last, Failed) and "sampler broke" in str(last.error)
    assert col.done("a").text == col.done("b").text == want.text
    assert alone(engine, job("after", "one two")).text == want.text  # the engine goes on


def test_a_broken_forward_pass_fails_that_steps_requests_and_the_engine_goes_on(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = alone(engine, job("ref", "one two"))
    col = Collector()
    for j in (job("a", "one two"), job("b", "one two")):
        engine.add(j, col.sink(j.id))
    engine.step()  # the prefills
    real = engine._decode
    calls = []

    def broken() -> None:
        calls.append(1)
        raise RuntimeError("forward pass broke")

    monkeypatch.setattr(engine, "_decode", broken)
    engine.step()
    assert calls and all(isinstance(col.events[j][-1], Failed) for j in ("a", "b"))
    assert not engine.has_work
    monkeypatch.setattr(engine, "_decode", real)
    assert alone(engine, job("after", "one two")).text == want.text


def test_the_runner_stops_only_an_engine_that_breaks_every_step(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = EngineRunner(engine, "t")
    try:
        failures = iter([RuntimeError("once")])

        def step_once_broken(real: Callable[[], None] = engine.step) -> None:
            err = next(failures, None)
            if err is not None:
                engine.fail_all(err)  # (what a step that broke leaves behind)
                raise err
            real()

        monkeypatch.setattr(engine, "step", step_once_broken)
        col = Collector()
        runner.add(job("x"), col.sink("x")).result(10)
        _wait(lambda: bool(col.events.get("x")) and isinstance(col.events["x"][-1], Failed | Done))
        assert isinstance(col.events["x"][-1], Failed)
        assert runner.alive  # one broken step: its job failed, the engine goes on
        runner.add(job("y"), col.sink("y")).result(10)
        _wait(lambda: bool(col.events.get("y")) and isinstance(col.events["y"][-1], Failed | Done))
        assert isinstance(col.events["y"][-1], Done)

        def always_broken() -> None:
            raise RuntimeError("gone")

        monkeypatch.setattr(engine, "step", always_broken)
        for i in range(MAX_BROKEN_STEPS):
            runner.add(job(f"z{i}"), col.sink(f"z{i}")).result(10)
            _wait(lambda i=i: bool(col.events.get(f"z{i}")))
        _wait(lambda: not runner.alive)
        assert "gone" in str(runner.error)
    finally:
        runner.close()


def _wait(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
