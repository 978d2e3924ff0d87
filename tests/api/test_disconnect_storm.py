"""A hundred clients that leave mid-stream (closing or resetting their connection):
no slot is leaked, as the metrics say (``laneway_worker_slots_busy`` back to 0)."""

from __future__ import annotations

import json
import re
import socket
import struct
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from laneway.config import ServerConfig
from live_server import LiveServer, live_server, sim_config, tiny


def _stream_then_leave(server: LiveServer, model: str, n: int, reset: bool) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    body = json.dumps({"model": model, "prompt": "x", "max_tokens": 2000, "stream": True, "ignore_eos": True})
    s.sendall(
        f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n{body}".encode()
    )
    got = b""
    while got.count(b"data: ") < n:  # a few chunks: it is streaming
        part = s.recv(65536)
        assert part, got
        got += part
    if reset:  # an abrupt end (RST), as a crashed client's
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return s


def _busy(server: LiveServer) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return {
        m[0]: float(m[1]) for m in re.findall(r'laneway_worker_slots_busy\{worker="([^"]+)"\} (\S+)', text)
    }


def _wait_idle(server: LiveServer, timeout: float = 20.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    busy = _busy(server)
    while any(busy.values()) or server.runtime.tickets:
        assert time.monotonic() < deadline, busy
        time.sleep(0.05)
        busy = _busy(server)
    return busy


@pytest.mark.parametrize("engine", ["simulated", "local"])
def test_a_hundred_clients_leaving_mid_stream_leak_no_slot(tmp_path: Path, engine: str) -> None:
    if engine == "simulated":
        config = sim_config(tmp_path, slots=4, tokens_per_s=500.0)
        model, waves = "sim", 25
    else:
        config = replace(ServerConfig(), workers=(tiny(4),), data_dir=tmp_path)
        model, waves = "builtin:tiny", 25
    with live_server(config) as server:
        name = config.workers[0].name
        left = 0
        for wave in range(waves):  # each wave fills every slot, then leaves
            socks = [_stream_then_leave(server, model, 2, reset=(wave + i) % 2 == 0) for i in range(4)]
            assert _busy(server)[name] == 4
            for s in socks:
                s.close()
            left += len(socks)
        assert left == 100
        assert _wait_idle(server) == {name: 0.0}
        assert server.runtime.sched.live == 0 and server.runtime.sched.free_slots == 4
        r = httpx.post(
            server.base_url + "/completions", json={"model": model, "prompt": "x", "max_tokens": 2}
        )
        assert r.status_code == 200
