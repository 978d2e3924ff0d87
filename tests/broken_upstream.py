"""A deliberately broken OpenAI-compatible upstream: the prompt names how it misbehaves.

An ASGI app of one model (``m``), served on a thread by ``live_server.serving``. A completion whose
prompt (a Responses request whose input) starts with one of :data:`MODES` gets that
misbehaviour; any other prompt a proper two-token stream. ``/v1/models`` answers properly,
so the worker is seen healthy.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

MiB = 1 << 20
PAGE = (
    b"<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1>"
    b"<script>alert('x')</script></body></html>"
)
MODES = {
    "html200": "a 200 that is an HTML page",
    "json200": "a 200 that is a JSON object, not an event stream",
    "notjson": "an event stream whose event is not JSON",
    "htmlerror": "a 502 whose body is an HTML page with a script",
    "trickle": "a 200 stream that sends one byte every 0.3 s, never an event",
    "hugeusage": "usage.completion_tokens of 30 digits",
    "negusage": "usage.completion_tokens negative",
    "floatusage": "usage.completion_tokens not an integer",
    "listusage": "usage that is not an object",
    "bigevent": "one event of 50 MiB that never ends",
    "bigerror": "a 500 whose body is 300 MiB",
    "manyids": "5 M token ids, streamed",
    "truncated": "a stream that ends cleanly before its answer does",
    "empty": "a 200 event stream with no event",
    "toomany": "a stream of three times max_tokens tokens",
    "cutatmax": "a stream of max_tokens tokens that ends before its finish",
    "busy": "a 429 (the engine is busy)",
    "wrongtext": "a chunk whose text is a number",
    "wrongfinish": "a chunk whose finish_reason is a number",
    "error400": "a 200 stream whose one event is a 400 error (vLLM: a grammar it cannot compile)",
    "error500": "a 200 stream whose one event is a 500 error",
    "cut": "a stream broken off after its first event (the connection dropped)",
}


def chunk(text: str, finish: str | None = None, ids: list[int] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
    if ids is not None:
        c["token_ids"] = ids
    return {"id": "cmpl-x", "object": "text_completion", "created": 0, "model": "m", "choices": [c]}


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


class Broken:
    def __init__(self) -> None:
        self.served: list[str] = []  # the modes asked, in order
        self.open = 0  # generation requests open now

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/v1/models":
            await self._whole(send, 200, b"application/json", json.dumps({"data": [{"id": "m"}]}).encode())
            return
        raw = b""
        while True:
            msg = await receive()
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        body = json.loads(raw)
        mode = str(body.get("prompt", body.get("input", ""))).split(" ")[0]
        self.served.append(mode)
        self.open += 1
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            await self._answer(mode, body, send, gone)
        except OSError:
            pass  # (the client went away)
        finally:
            watcher.cancel()
            self.open -= 1

    async def _whole(self, send: Any, status: int, ctype: bytes, body: bytes) -> None:
        head = [(b"content-type", ctype), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": body})

    async def _start(self, send: Any, status: int = 200, ctype: bytes = b"text/event-stream") -> None:
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", ctype)]})

    async def _more(self, send: Any, data: bytes) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": True})

    async def _end(self, send: Any, data: bytes = b"") -> None:
        await send({"type": "http.response.body", "body": data, "more_body": False})

    async def _answer(self, mode: str, body: dict[str, Any], send: Any, gone: asyncio.Event) -> None:
        if mode == "cut":  # (an app that fails once its answer began: the server drops the connection)
            await self._start(send)
            created = {"id": "resp_x", "status": "in_progress"}
            first = {"type": "response.created", "response": created, "sequence_number": 0}
            await self._more(send, sse(first if "input" in body else chunk("a")))
            await asyncio.sleep(0.1)
            raise RuntimeError("broken off (a deliberately broken upstream)")
        if mode in ("error400", "error500"):
            status = int(mode[5:])
            error = {
                "message": "Grammar error: Invalid type: notatype",
                "type": "BadRequestError",
                "code": status,
            }
            if status == 500:
                error = {"message": "engine fault", "type": "InternalServerError", "code": status}
            await self._start(send)
            await self._end(send, sse({"error": error}) + b"data: [DONE]\n\n")
            return
        if mode == "html200":
            await self._whole(send, 200, b"text/html", PAGE)
        elif mode == "json200":
            await self._whole(send, 200, b"application/json", b'{"ok": true}')
        elif mode == "htmlerror":
            await self._whole(send, 502, b"text/html", PAGE)
        elif mode == "notjson":
            await self._start(send)
            await self._end(send, b"data: <html>nope</html>\n\n")
        elif mode == "trickle":
            await self._start(send)
            for _ in range(200):  # (bounded: 60 s, or until the client leaves)
                if gone.is_set():
                    return
                await self._more(send, b":")
                await asyncio.sleep(0.3)
            await self._end(send)
        elif mode in ("hugeusage", "negusage", "floatusage", "listusage"):
            usage: object = {
                "hugeusage": {**USAGE, "completion_tokens": 10**30},
                "negusage": {**USAGE, "completion_tokens": -5},
                "floatusage": {**USAGE, "completion_tokens": 2.5},
                "listusage": [1, 2],
            }[mode]
            await self._start(send)
            await self._more(send, sse(chunk("a")) + sse(chunk(" b", "length")))
            await self._end(send, sse({**chunk(""), "choices": [], "usage": usage}) + b"data: [DONE]\n\n")
        elif mode == "bigevent":
            await self._start(send)
            await self._more(send, b'data: {"x": "')
            piece = b"x" * MiB
            for _ in range(50):
                if gone.is_set():
                    return
                await self._more(send, piece)
            await self._end(send)
        elif mode == "bigerror":
            await self._start(send, 500, b"text/plain")
            piece = b"e" * MiB
            for _ in range(300):
                if gone.is_set():
                    return
                await self._more(send, piece)
            await self._end(send)
        elif mode == "manyids":
            await self._start(send)
            ids = list(range(50_000))
            for _ in range(100):
                if gone.is_set():
                    return
                await self._more(send, sse(chunk("z", ids=ids)))
            await self._end(send, sse(chunk("", "length")) + b"data: [DONE]\n\n")
        elif mode == "truncated":
            await self._start(send)
            await self._end(send, sse(chunk("half")))
        elif mode == "empty":
            await self._start(send)
            await self._end(send)
        elif mode in ("toomany", "cutatmax"):
            n = int(body.get("max_tokens") or 1) * (3 if mode == "toomany" else 1)
            await self._start(send)
            await self._end(send, b"".join(sse(chunk(f" t{i}")) for i in range(n)))
        elif mode in ("wrongtext", "wrongfinish"):
            wrong = {**chunk("a"), "choices": [{"index": 0, "text": 5, "finish_reason": None}]}
            if mode == "wrongfinish":
                wrong = {**chunk("a"), "choices": [{"index": 0, "text": "a", "finish_reason": 5}]}
            await self._start(send)
            await self._end(send, sse(wrong) + b"data: [DONE]\n\n")
        elif mode == "busy":
            error = {"error": {"message": "too many requests", "type": "rate_limit", "code": 429}}
            await self._whole(send, 429, b"application/json", json.dumps(error).encode())
        else:
            await self._start(send)
            await self._more(send, sse(chunk("a")) + sse(chunk(" b", "length")))
            await self._end(send, sse({**chunk(""), "choices": [], "usage": USAGE}) + b"data: [DONE]\n\n")
