"""A thousand preempted requests' checkpoints stay within the host-memory budget."""

from __future__ import annotations

from pathlib import Path

import torch

from laneway.engine.checkpoints import CheckpointStore, kv_nbytes
from laneway.engine.engine import Engine
from laneway.engine.models import LoadedModel

from .helpers import Collector, alone, greedy, job, run_all


def test_thousand_checkpoints_hold_the_spill_budget(tiny: LoadedModel, tmp_path: Path) -> None:
    budget = 100_000  # bytes: a few dozen checkpoints of the tiny model
    engine = Engine(tiny, slots=16, data_dir=tmp_path, spill_budget_bytes=budget)
    col = Collector()
    ckpts = []
    peak = 0
    n = 0
    while len(ckpts) < 1000 and n < 2000:  # a full engine preempted at once, again and again
        batch = [job(f"r{k}", f"request number {k}", greedy(20)) for k in range(n, n + 16)]
        n += 16
        for j in batch:
            engine.add(j, col.sink(j.id))
        engine.step()  # the prefill and a first token
        for j in batch[: 1000 - len(ckpts)]:
            ckpt = engine.preempt(j.id, "checkpoint")
            if ckpt is None:  # it ended early (the model made its end-of-text token)
                continue
            assert ckpt.nbytes > 0
            ckpts.append(ckpt)
            peak = max(peak, engine.store.in_memory_bytes)
        for j in batch:
            engine.cancel(j.id)
    assert len(ckpts) == 1000 and engine.busy == 0
    assert peak <= budget
    total = sum(c.nbytes for c in ckpts)
    assert total > 50 * budget  # far more than the budget was checkpointed ...
    assert engine.store.spilled_bytes + engine.store.in_memory_bytes == total  # ... and all of it is kept
    spilled = list((tmp_path / "checkpoints").glob("*.pt"))
    assert len(spilled) == 1000 - engine.store.held
    # the oldest (spilled) and the newest (in memory) resume exactly
    for ckpt in (ckpts[0], ckpts[-1]):
        engine.resume(ckpt, col.sink(ckpt.job.id))
        run_all(engine, col)
        assert col.done(ckpt.job.id).text == alone(engine, ckpt.job).text
    for ckpt in ckpts[1:-1]:
        engine.discard(ckpt)
    assert engine.store.in_memory_bytes == 0 and engine.store.spilled_bytes == 0
    assert not list((tmp_path / "checkpoints").glob("*.pt"))


def test_store_keeps_newest_in_memory_and_restores_tensors(tmp_path: Path) -> None:
    store = CheckpointStore(budget_bytes=3 * 4096, spill_dir=tmp_path)
    kvs = [[(torch.full((1, 2, 4, 64), float(i)), torch.full((1, 2, 4, 64), -float(i)))] for i in range(5)]
    assert kv_nbytes(kvs[0]) == 4096
    saved = [store.put(kv) for kv in kvs]
    assert [s.kv is not None for s in saved] == [False, False, True, True, True]
    assert store.in_memory_bytes == 3 * 4096 and store.spills == 2
    for s, kv in zip(saved, kvs, strict=True):
        back = store.take(s)
        assert torch.equal(back[0][0], kv[0][0]) and torch.equal(back[0][1], kv[0][1])
    assert store.in_memory_bytes == 0 and store.spilled_bytes == 0
