"""Batches never block chat: a P0 request sent while batch lines fill every slot is answered at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from batch_util import chat_line, client, submit, wait
from laneway.config import BatchConfig
from live_server import LiveServer, live_server, sim_config

SLOTS = 2
LINE_S = 5.0  # each batch line holds a slot this long (500 tokens at 100/s)


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    cfg = sim_config(tmp_path_factory.mktemp("slow"), slots=SLOTS, tokens_per_s=100.0)
    with live_server(replace(cfg, batches=BatchConfig(poll_s=0.1))) as server:
        yield server


def p0_latency(server: LiveServer) -> tuple[float, dict[str, object]]:
    c = client(server.base_url)
    t0 = time.monotonic()
    r = c.chat.completions.create(
        model="sim",
        messages=[{"role": "user", "content": "urgent"}],
        max_tokens=5,
        extra_body={"priority": "P0"},
    )
    return time.monotonic() - t0, r.model_extra["laneway"]


def test_p0_chat_is_answered_promptly_while_a_batch_fills_every_slot(slow: LiveServer) -> None:
    idle, _ = p0_latency(slow)
    c = client(slow.base_url)
    b = submit(c, [chat_line(f"b{i}", max_tokens=int(LINE_S * 100)) for i in range(200)])
    wait(c, b.id, until=["in_progress"])
    deadline = time.monotonic() + 10
    while slow.runtime.workers["sim0"].capacity().busy < SLOTS:  # every slot runs a batch line
        assert time.monotonic() < deadline
        time.sleep(0.02)
    busy, ext = p0_latency(slow)
    print(f"P0 chat latency: idle {idle * 1000:.0f} ms, under a saturating batch {busy * 1000:.0f} ms")
    assert ext["priority"] == "P0" and ext["preemptions"] == 0
    assert busy < 1.5 < LINE_S  # it did not wait for a batch line to end
    assert c.batches.retrieve(b.id).request_counts.completed == 0
    c.batches.cancel(b.id)
    assert wait(c, b.id).status == "cancelled"
