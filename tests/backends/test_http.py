"""The upstream HTTP client against small real servers on loopback (asyncio streams)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from laneway.backends import http
from laneway.backends.http import Aborted, Collect, Cut, Events, HttpError, Pool, Stale, Target, Timeout
from laneway.testing import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + (await reader.readexactly(length) if length else b"")


class Served:
    """A server on loopback whose connections are closed with it."""

    def __init__(self, server: asyncio.Server, writers: list[asyncio.StreamWriter]) -> None:
        self.server = server
        self.writers = writers

    def close(self) -> None:
        for w in self.writers:
            w.close()
        self.server.close()


async def serve(handler: Handler) -> tuple[Served, str]:
    writers: list[asyncio.StreamWriter] = []

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(run, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return Served(server, writers), f"http://127.0.0.1:{port}/v1"


def test_whole_answers_on_one_kept_alive_connection() -> None:
    peers: list[object] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peername"))
        while True:
            try:
                req = await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            body = b'{"path": "%s"}' % req.split(b" ")[1]
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    async def main() -> None:
        server, url = await serve(handler)
        pool = Pool(url)
        try:
            for rel in ("models", "/detokenize", "models"):
                got = await pool.fetch("GET", rel, timeout_s=5)
                assert got.status == 200
            assert got.body == b'{"path": "/v1/models"}'
            assert (
                await pool.fetch("POST", "/detokenize", b"{}", timeout_s=5)
            ).body == b'{"path": "/detokenize"}'
            assert len(peers) == 1  # one connection for all
        finally:
            await pool.close()
            server.close()
            await asyncio.sleep(0.05)

    asyncio.run(main())


def test_a_chunked_event_stream_is_split_into_events_as_it_arrives() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
        )
        # events split across chunks, CRLF line ends, a comment, a two-line data field
        for piece in (
            b'data: {"a"',
            b": 1}\n\ndata: 2\r\n\r\n: ping\n\n",
            b"data: x\ndata: y\n\ndata: [DONE]\n\n",
        ):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def main() -> None:
        server, url = await serve(handler)
        pool = Pool(url)
        events: list[bytes] = []
        try:
            reader = Events(events.append)
            exchange = await pool.request(
                "POST", "chat/completions", b"{}", reader, accept=b"text/event-stream"
            )
            await asyncio.wait_for(exchange.done, 5)
            assert reader.status == 200
            assert events == [b'{"a": 1}', b"2", b"x\ny", b"[DONE]"]
        finally:
            await pool.close()
            server.close()
            await asyncio.sleep(0.05)

    asyncio.run(main())


def test_abort_ends_an_exchange_at_once_and_the_server_sees_the_connection_go() -> None:
    gone = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"6\r\ndata: \r\n")
        await writer.drain()
        await reader.read()  # until the client closes
        gone.set()

    async def main() -> None:
        server, url = await serve(handler)
        pool = Pool(url)
        try:
            exchange = await pool.request("POST", "completions", b"{}", Events(lambda _: None))
            await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            exchange.abort()
            with pytest.raises(Aborted):
                await exchange.done
            assert time.perf_counter() - t0 < 0.05
            await asyncio.wait_for(gone.wait(), 5)
        finally:
            await pool.close()
            server.close()
            await asyncio.sleep(0.05)

    asyncio.run(main())


def test_a_stalled_answer_times_out_and_failures_are_told_apart() -> None:
    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        await reader.read()  # nothing more, until the client gives up

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        writer.close()

    async def main() -> None:
        slow, slow_url = await serve(stall)
        rude, rude_url = await serve(hang_up)
        pools = [Pool(slow_url), Pool(rude_url), Pool(f"http://127.0.0.1:{free_port()}/v1")]
        try:
            t0 = time.perf_counter()
            exchange = await pools[0].request("POST", "completions", b"{}", Collect(), stall_s=0.3)
            with pytest.raises(Timeout, match=r"sent nothing for 0\.3 s"):
                await exchange.done
            assert 0.3 <= time.perf_counter() - t0 < 2.0
            exchange = await pools[1].request("POST", "completions", b"{}", Collect())
            with pytest.raises(Cut, match=r"connection lost.*in the middle of its answer"):
                await exchange.done  # (its status came: the upstream broke off its answer)
            with pytest.raises(HttpError, match="could not connect") as info:
                await pools[2].fetch("GET", "models", timeout_s=5)
            assert not isinstance(info.value, Timeout) and info.value.retryable
        finally:
            for p in pools:
                await p.close()
            slow.close()
            rude.close()
            await asyncio.sleep(0.05)  # the handlers see their connections close

    asyncio.run(main())


def test_targets_are_http_urls() -> None:
    t = Target.parse("https://example.org/vllm/v1/")
    assert (t.scheme, t.host, t.port, t.path) == ("https", "example.org", 443, "/vllm/v1")
    assert Target.parse("http://[::1]:8001/v1").host_header == b"[::1]:8001"
    for bad in ("ftp://x/v1", "localhost:8000", "http://:80/v1", "http://x:99999/v1", "http://x/v1?a=1"):
        with pytest.raises(ValueError):
            Target.parse(bad)


def test_an_answer_nobody_asked_for_closes_the_idle_connection_it_came_on() -> None:
    """An upstream that sends a second, unasked answer after the first: the connection, idle
    in the pool, was put there again (twice in it, two requests could share it); now it is
    closed, and the next request goes on a new one."""
    peers: list[object] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peername"))
        first = True
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            if first:
                first = False
                await asyncio.sleep(0.05)  # (the client has put the connection back)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nextra")
                await writer.drain()

    async def main() -> None:
        server, url = await serve(handler)
        pool = Pool(url)
        try:
            assert (await pool.fetch("GET", "models", timeout_s=5)).body == b"ok"
            await asyncio.sleep(0.2)
            assert len(pool._idle) == 0, pool._idle  # (it was in it twice)
            got = await asyncio.gather(*(pool.fetch("GET", "models", timeout_s=5) for _ in range(2)))
            assert [g.body for g in got] == [b"ok", b"ok"]
            assert len(peers) == 3  # the first, closed; one each for the two after
        finally:
            await pool.close()
            server.close()

    asyncio.run(main())


def test_a_kept_alive_connection_closed_as_a_request_goes_is_stale_and_an_idle_one_expires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An upstream that closes a kept-alive connection when the next request arrives on it
    (its idle timeout, just then): that request fails :class:`Stale` (told apart from an
    upstream gone); a connection idle for ``KEEP_IDLE_S`` is not used again."""
    peers: list[object] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peername"))
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await read_request(reader)  # the second on it: closed unanswered

    async def main() -> None:
        server, url = await serve(handler)
        pool = Pool(url)
        try:
            assert (await pool.fetch("GET", "models", timeout_s=5)).body == b"ok"
            with pytest.raises(Stale, match="connection lost") as info:
                await pool.fetch("GET", "models", timeout_s=5)
            assert info.value.retryable and len(peers) == 1
            assert (await pool.fetch("GET", "models", timeout_s=5)).body == b"ok"  # a new one
            assert len(peers) == 2
            monkeypatch.setattr(http, "KEEP_IDLE_S", 0.05)
            await asyncio.sleep(0.1)
            assert (await pool.fetch("GET", "models", timeout_s=5)).body == b"ok"  # not the idle one
            assert len(peers) == 3
        finally:
            await pool.close()
            server.close()
            await asyncio.sleep(0.05)

    asyncio.run(main())
