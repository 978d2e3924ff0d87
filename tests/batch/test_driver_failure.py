"""A batch driver that fails (the store cannot be written for a while) is tried again
after ever longer waits, logging its traceback once — not a loop once a poll — and the
batch completes once the store works again; a file that breaks validation fails its batch."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

import pytest

from batch_util import chat_line, client, submit, wait
from laneway.config import BatchConfig
from live_server import live_server, sim_config


def test_a_failing_driver_backs_off_then_the_batch_completes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = replace(sim_config(tmp_path, slots=4, tokens_per_s=500.0), batches=BatchConfig(poll_s=0.1))
    with live_server(cfg) as server, caplog.at_level(logging.ERROR, logger="laneway"):
        store = server.app.state.store  # type: ignore[attr-defined]
        real = store.claim

        async def unwritable(*args: object, **kw: object) -> object:
            raise OSError(28, "No space left on device")

        store.claim = unwritable
        c = client(server.base_url)
        b = submit(c, [chat_line(f"l{i}") for i in range(5)])
        time.sleep(2.0)
        failures = [r for r in caplog.records if "driver failed" in r.getMessage()]
        # poll 0.1 s: retries after 0.2, 0.4, 0.8 s... at most 4 in 2 s (not 20)
        assert 2 <= len(failures) <= 4, [r.getMessage() for r in failures]
        assert sum(1 for r in failures if r.exc_info) == 1  # the traceback once
        store.claim = real
        done = wait(c, b.id, timeout_s=30)
        assert done.status == "completed" and done.request_counts.completed == 5


def test_a_file_that_breaks_the_checker_fails_its_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from laneway.batch import runner as batches

    def broken(*args: object, **kw: object) -> object:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(batches, "validate_input", broken)
    cfg = replace(sim_config(tmp_path), batches=BatchConfig(poll_s=0.1))
    with live_server(cfg) as server:
        c = client(server.base_url)
        b = wait(c, submit(c, [chat_line("a")]).id, timeout_s=10)
        assert b.status == "failed"
        assert [e.code for e in b.errors.data] == ["validation_error"]
        assert "could not be validated" in b.errors.data[0].message
