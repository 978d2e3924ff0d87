"""A client that goes away cancels its request and frees the slot."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from live_server import LiveServer


def wait_for(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def idle(server: LiveServer) -> bool:
    rt = server.runtime
    return rt.sched.live == 0 and not rt.tickets and all(w.capacity().busy == 0 for w in rt.workers.values())


def test_streaming_disconnect_frees_the_slot(sim_server: LiveServer) -> None:
    wait_for(lambda: idle(sim_server))
    body = {"model": "sim", "prompt": "x", "max_tokens": 100000, "stream": True}
    with httpx.stream("POST", sim_server.base_url + "/completions", json=body, timeout=30) as resp:
        lines = resp.iter_lines()
        got = [line for line, _ in zip(lines, range(6), strict=False) if line]
        assert got and got[0].startswith("data: ")
        assert sim_server.runtime.sched.live == 1
    wait_for(lambda: idle(sim_server))
    assert sim_server.runtime.sched.free_slots == 2


def test_non_streaming_disconnect_while_running_or_queued(sim_server: LiveServer) -> None:
    wait_for(lambda: idle(sim_server))
    body = {"model": "sim", "prompt": "x", "max_tokens": 100000}
    for _ in range(3):  # two run, one queues; the client gives up on all of them
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(sim_server.base_url + "/completions", json=body, timeout=0.3)
    wait_for(lambda: idle(sim_server))
    ok = httpx.post(sim_server.base_url + "/completions", json={**body, "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200
