"""Idle and slow connections are timed out and capped: they cannot lock new clients out."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from laneway.connections import cap_for, raise_fd_limit
from live_server import LiveServer, live_server, sim_config

HEAD = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"


@pytest.fixture
def server(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Iterator[LiveServer]:
    config = replace(sim_config(tmp_path), header_timeout_s=0.5, body_timeout_s=0.8, max_connections=20)
    with caplog.at_level(logging.WARNING), live_server(config) as s:
        yield s
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def _connect(server: LiveServer) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=5)
    return s


def _answer(s: socket.socket, timeout: float = 5.0) -> bytes:
    """What the server sends until it closes the connection (or ``timeout``)."""
    s.settimeout(timeout)
    got = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            part = s.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not part:
            break
        got += part
    return got


def test_silent_slow_head_and_slow_body_connections_are_closed(server: LiveServer) -> None:
    silent, head, body = _connect(server), _connect(server), _connect(server)
    try:
        head.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")  # ... and the rest never
        body.sendall(HEAD + b"content-length: 100\r\n\r\n" + b'{"model": ')  # 10 of 100 bytes
        t0 = time.monotonic()
        assert _answer(silent) == b""
        assert _answer(head).startswith(b"HTTP/1.1 408 ")
        answer = _answer(body)
        took = time.monotonic() - t0
        assert answer.startswith(b"HTTP/1.1 408 ") and b'"code":"request_timeout"' in answer
        assert 0.4 < took < 4.0
    finally:
        for s in (silent, head, body):
            s.close()
    r = httpx.post(server.base_url + "/completions", json={"model": "sim", "prompt": "x", "max_tokens": 2})
    assert r.status_code == 200


def _healthz(s: socket.socket) -> bytes:
    s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
    s.settimeout(5)
    got = b""
    while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
        part = s.recv(65536)
        if not part:
            break
        got += part
    return got


def test_idle_keep_alive_connections_make_room_and_busy_ones_get_a_503(server: LiveServer) -> None:
    idle: list[socket.socket] = []
    busy: list[socket.socket] = []
    try:
        answers = []
        for _ in range(60):  # three times the cap, each kept alive after its request
            idle.append(_connect(server))
            answers.append(_healthz(idle[-1]))
        assert all(a.startswith(b"HTTP/1.1 200 ") for a in answers)  # the longest idle made room
        with httpx.Client(timeout=5) as c:
            assert c.get(server.url + "/healthz").status_code == 200
        for _ in range(25):  # past the cap, every one in the middle of a request
            s = _connect(server)
            s.sendall(HEAD + b"content-length: 100\r\n\r\n{")
            busy.append(s)
        newcomer = _connect(server)
        try:
            got = _answer(newcomer, 0.5)
            assert got.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in got.lower()
        finally:
            newcomer.close()
        answers = [_answer(s, 0.01) for s in busy]  # (all sent by now)
        assert sum(a.startswith(b"HTTP/1.1 503 ") for a in answers) == 5  # those past the cap
        time.sleep(1.0)  # the slow bodies time out (0.8 s)
        with httpx.Client(timeout=5) as c:
            assert c.get(server.url + "/healthz").status_code == 200
    finally:
        for s in idle + busy:
            s.close()


def test_the_descriptor_limit_is_raised_and_the_cap_left_below_it() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        assert raise_fd_limit() == (hard if hard != resource.RLIM_INFINITY else 1 << 16)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert cap_for(1024) == 896 and cap_for(256) == 192 and cap_for(100_000) == 87_500


def test_a_head_past_max_header_bytes_gets_431_and_one_below_it_is_served(server: LiveServer) -> None:
    s = _connect(server)
    try:  # 70 KB of headers (over the 64 KiB default) and no end to them yet
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 70_000)
        got = _answer(s)
        assert got.startswith(b"HTTP/1.1 431 ") and b'"code":"headers_too_large"' in got
        assert b"65536 bytes" in got and b"connection: close" in got
    finally:
        s.close()
    with httpx.Client(timeout=10) as c:
        big = c.get(server.url + "/healthz", headers={"x-big": "a" * 50_000})
        assert big.status_code == 200
        # a large body is not a large head, and two requests in one read are two requests
        long_prompt = {"model": "sim", "prompt": "word " * 150_000, "max_tokens": 1}
        assert c.post(server.base_url + "/completions", json=long_prompt).status_code == 200
    s = _connect(server)
    try:
        body = b'{"model": "sim", "prompt": "' + b"x" * 100_000 + b'", "max_tokens": 1}'
        one = HEAD + b"content-length: %d\r\n\r\n" % len(body) + body
        s.sendall(one + one.replace(b"HTTP/1.1\r\n", b"HTTP/1.1\r\nconnection: close\r\n", 1))
        got = _answer(s, 10)
        assert got.count(b"HTTP/1.1 200 ") == 2, got[:300]
    finally:
        s.close()


def test_megabytes_of_headers_cost_the_loop_one_read_not_seconds(tmp_path: Path) -> None:
    """A client streaming 32 MB of one header is cut off at the limit (not by the head's
    time limit, here long); others are answered meanwhile."""
    config = replace(sim_config(tmp_path), header_timeout_s=60.0)
    with live_server(config) as server:
        _flood_headers(server)


def _flood_headers(server: LiveServer) -> None:

    s = _connect(server)
    sent = [0]

    def flood() -> None:
        chunk = b"a" * 65536
        try:
            s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: ")
            for _ in range(512):
                s.sendall(chunk)
                sent[0] += len(chunk)
        except OSError:
            pass  # (closed by the server)

    t = threading.Thread(target=flood, daemon=True)
    t0 = time.monotonic()
    t.start()
    try:
        with httpx.Client(timeout=5) as c:
            for _ in range(5):
                assert c.get(server.url + "/healthz").status_code == 200
        t.join(10)
        assert not t.is_alive() and sent[0] < 32 << 20  # cut off before the end
        assert time.monotonic() - t0 < 8
    finally:
        s.close()


def test_a_malformed_request_gets_400_in_openai_shape(server: LiveServer) -> None:
    s = _connect(server)
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nbad header line\r\n\r\n")
        got = _answer(s)
        assert got.startswith(b"HTTP/1.1 400 ") and b"application/json" in got
        assert b'"code":"invalid_http"' in got
    finally:
        s.close()


@pytest.mark.parametrize(
    "head",
    [
        b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 100_000 + b"\r\n\r\n",  # whole, in one read
        b"GET /healthz?" + b"q" * 100_000 + b" HTTP/1.1\r\nhost: x\r\n\r\n",  # a long URL
        b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + b"x-a: b\r\n" * 12_000 + b"\r\n",  # many small ones
    ],
    ids=["one-header", "url", "many-headers"],
)
def test_a_whole_head_past_the_limit_in_one_read_gets_431(server: LiveServer, head: bytes) -> None:
    s = _connect(server)
    try:
        s.sendall(head)
        got = _answer(s)
        assert got.startswith(b"HTTP/1.1 431 ") and b'"code":"headers_too_large"' in got, got[:200]
    finally:
        s.close()


def test_chunked_trailers_count_against_the_head_limit_and_are_dropped(server: LiveServer) -> None:
    body = b'{"model": "sim", "prompt": "hi", "max_tokens": 1}'
    chunked = HEAD + b"transfer-encoding: chunked\r\n\r\n" + b"%x\r\n" % len(body) + body + b"\r\n0\r\n"
    s = _connect(server)
    try:  # 100 KB of small trailers: refused, not held in memory and handed to the app
        s.sendall(chunked + b"a: b\r\n" * 17_000 + b"\r\n")
        got = _answer(s)
        assert got.startswith(b"HTTP/1.1 431 "), got[:200]
    finally:
        s.close()
    s = _connect(server)
    try:  # a small trailer is fine
        s.sendall(
            chunked.replace(HEAD, HEAD.replace(b"HTTP/1.1\r\n", b"HTTP/1.1\r\nconnection: close\r\n"))
            + b"x-checksum: 1\r\n\r\n"
        )
        assert _answer(s).startswith(b"HTTP/1.1 200 ")
    finally:
        s.close()


def test_a_slow_second_head_on_a_kept_connection_gets_408(server: LiveServer) -> None:
    s = _connect(server)
    try:
        assert _healthz(s).startswith(b"HTTP/1.1 200 ")
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")  # ... and the rest never
        assert _answer(s).startswith(b"HTTP/1.1 408 ")
    finally:
        s.close()
