"""How a handler watches its client and writes its stream: a watch only for answers that
take a while, and the chunks at hand written together, none held back for the next."""

from __future__ import annotations

import asyncio
import json

from starlette.types import Message

from laneway.api.completions import _chunks
from laneway.api.streaming import DisconnectWatch
from laneway.generation import CHAT, Done, Job, SamplingParams, Usage
from laneway.generation import Delta as D
from laneway.protocol.responses import Shape
from laneway.runtime import Ticket


def ticket() -> Ticket:
    job = Job("chatcmpl-1", "m", SamplingParams(max_tokens=8), prompt="hi", kind=CHAT, stream=True)
    return Ticket(job, 1, "P1", None, 0.0)


class Receiver:
    """An ASGI ``receive`` whose client has left: it counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> Message:
        self.calls += 1
        return {"type": "http.disconnect"}


def test_an_answer_ready_before_the_watch_starts_never_reads_the_connection() -> None:
    async def go() -> tuple[int, list[str]]:
        receive, seen = Receiver(), []
        watch = DisconnectWatch(receive, lambda: seen.append("gone"), after_s=0.2)
        await asyncio.sleep(0.02)
        watch.stop()
        await asyncio.sleep(0.3)  # (past when it would have started)
        return receive.calls, seen

    calls, seen = asyncio.run(go())
    assert calls == 0 and seen == []


def test_a_client_gone_before_the_watch_starts_is_seen_when_it_starts() -> None:
    async def go() -> tuple[bool, list[str]]:
        receive, seen = Receiver(), []
        watch = DisconnectWatch(receive, lambda: seen.append("gone"), after_s=0.05)
        for _ in range(100):  # (at most 1 s)
            if seen:
                break
            await asyncio.sleep(0.01)
        watch.stop()
        return watch.gone, seen

    gone, seen = asyncio.run(go())
    assert gone and seen == ["gone"]


def events(raw: bytes) -> list[object]:
    out: list[object] = []
    for block in raw.decode().split("\n\n"):
        if block:
            assert block.startswith("data: ")
            data = block[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_chunks_at_hand_go_out_in_one_write_and_later_ones_in_their_own() -> None:
    async def go() -> list[bytes]:
        t = ticket()
        shape = Shape(CHAT, t.id, "m", 0)
        first = D(t.id, "a", 1)
        t.put(D(t.id, "b", 2))
        t.put(D(t.id, "c", 3))  # (two more already there when the stream starts)
        writes: list[bytes] = []
        stream = _chunks(shape, t, first, False, False)
        writes.append(await anext(stream))
        later = asyncio.get_running_loop().call_later(0.05, t.put, D(t.id, "d", 4))
        writes.append(await anext(stream))  # (waits for it: nothing at hand)
        t.put(Done(t.id, "length", Usage(1, 4), "abcd"))
        writes.extend([w async for w in stream])
        later.cancel()
        return writes

    writes = asyncio.run(go())
    assert len(writes) == 3
    first = events(writes[0])
    assert [c["choices"][0]["delta"].get("content") for c in first] == ["", "a", "b", "c"]  # type: ignore[index]
    assert [c["choices"][0]["delta"]["content"] for c in events(writes[1])] == ["d"]  # type: ignore[index]
    last = events(writes[2])
    assert last[-1] == "[DONE]"
    assert last[0]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
