"""A stand-in OpenAI-compatible engine: vLLM's HTTP behaviour at a set pace, no model.

    python -m laneway.standin [--host 127.0.0.1] [--port 8001] [--slots 4] [--ms-per-token 2]
                              [--model standin] [--refuse FIELD ...] [--load-s 0]
                              [--enable-sleep-mode [--wake-s 0]] [--enable-lora [--lora-load-s 0]]

For benchmarks and tests of laneway in front of an engine, where a real
engine's own cost would drown what is measured. It behaves as vLLM does
where laneway relies on it: ``/v1/completions`` and ``/v1/chat/completions``
(streamed or not, ``stream_options.include_usage``), ``return_token_ids``
(``prompt_token_ids`` in the first chunk, ``token_ids`` in each), prompts as
token ids, ``/v1/models``, ``/detokenize``, a few of vLLM's ``/metrics``
(requests running and waiting, its KV space, its prefix cache's counters: a
cache of ``kv_tokens`` in blocks of 16, least recently used out); at most ``slots`` sequences run,
the rest wait in its own FIFO queue (as an engine's do); every running
sequence gets a token each ``ms_per_token`` (0: all at once); a client that
goes away frees its slot at once.

Its "tokenizer" makes a token of each UTF-8 byte of a prompt and writes words
chosen from the prompt's bytes and the position (:mod:`laneway.standin_text`), so a
request resumed from its token ids writes exactly what it would have written in one
go. It writes until ``max_tokens`` (default 16). Its answers' shapes:
:mod:`laneway.standin_answers`.

For tests it counts (``/stats``) the most requests it had open at once, and
keeps when each request marked with a ``#KEY#`` in its prompt was open
(``/spans``): a request run twice at once shows as two spans of one key that
overlap. LoRA adapters loaded at run time: :mod:`laneway.standin_adapters`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import uuid
import zlib
from collections import OrderedDict, deque
from typing import Any

from laneway.arguments import OneLine, port, positive_int, seconds
from laneway.standin_adapters import Adapters, runtime_updating
from laneway.standin_answers import Seq, answer, chunk, head, send_json, send_sse, send_text, usage
from laneway.standin_text import BYTE_BASE, chat_prompt, decode, encode, next_token

KEY = re.compile(r"#([A-Za-z0-9_.-]{1,64})#")
MAX_KEY_SEARCH = 256  # prompt tokens searched for a key
MAX_SPANS = 200_000
CACHE_BLOCK = 16  # token ids a block of its prefix cache holds (vLLM's default)
DEFAULT_MAX_TOKENS = 16
MAX_MODEL_LEN = 4096  # the context it serves (its /v1/models says it): generation ends there, as vLLM's
PEAK_SETTLE_S = 0.005  # requests open at once are counted this long after each arrival ...
PEAK_SETTLE_TURNS = 8  # ... and this many turns of the loop later (each one reads the sockets)

Scope = dict[str, Any]


class StandIn:
    """The ASGI app."""

    def __init__(
        self,
        model: str = "standin",
        slots: int = 4,
        ms_per_token: float = 2.0,
        refuse: tuple[str, ...] = (),
        kv_tokens: int = 16_384,
        sleep_mode: bool = False,
        wake_s: float = 0.0,
        adapters: Adapters | None = None,
    ) -> None:
        self.model = model
        self.adapters = adapters  # (LoRA adapters it may load at run time; None: it loads none)
        # vLLM's sleep mode (--enable-sleep-mode with VLLM_SERVER_DEV_MODE=1): POST /sleep,
        # POST /wake_up (after wake_s), GET /is_sleeping; asleep, it serves nothing
        self.sleep_mode = sleep_mode
        self.wake_s = wake_s
        self.asleep = False
        self.stopping = False  # (told to stop: what runs ends at once)
        self.loop: asyncio.AbstractEventLoop | None = None  # (where it serves, once started)
        self.sleeps = self.wakes = 0
        self.kv_tokens = kv_tokens  # (what its /metrics says its KV space is)
        self.refuse = frozenset(refuse)  # request fields answered 400 (as an engine without them)
        self.slots = slots
        self.step_s = ms_per_token / 1000.0
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self._ticking = False
        self.served = 0  # sequences finished (tests read it)
        self.aborted = 0
        self.peak = 0  # most sequences running at once
        self.peak_requests = 0  # most generation requests open at once (running or waiting)
        self.peak_prompts: list[str] = []  # the beginnings of their prompts
        # each marked request's time here: (key, from, until) by the wall clock, so that tests
        # can tell whether one request ran twice at once, on this engine or beside another
        self.spans: deque[tuple[str, float, float]] = deque(maxlen=MAX_SPANS)
        self.opened: set[Seq] = set()
        # the vLLM `priority` each generation request carried (None: none), the latest last
        self.priorities: deque[object] = deque(maxlen=MAX_SPANS)
        # a prefix cache of its KV space (blocks of 16 token ids, least recently used out),
        # counted as vLLM counts its own: prompt tokens looked up, tokens found
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.prefix_queries = 0
        self.prefix_hits = 0

    # ------------------------------------------------------------ scheduling
    def _admit(self, seq: Seq) -> None:
        marked = KEY.search(decode(seq.prompt[:MAX_KEY_SEARCH]))
        if marked is not None:
            seq.key, seq.opened = marked.group(1), time.time()
            self.opened.add(seq)
        self.waiting.append(seq)
        self._fill()
        # counted a moment later: a connection its client closed just before sending this one
        # may not have been seen closed yet (both arrive in one turn of the loop). A moment is
        # not enough on a loaded machine: a process paused past it finds the timer due while
        # the close it read is still some turns from the request it ends, so the count also
        # waits for those turns.
        asyncio.get_running_loop().call_later(PEAK_SETTLE_S, self._count_open, PEAK_SETTLE_TURNS)

    def _count_open(self, turns: int = 0) -> None:
        if turns > 0:
            asyncio.get_running_loop().call_soon(self._count_open, turns - 1)
            return
        live = [s for s in (*self.waiting, *self.running) if not s.done and not s.gone]
        if len(live) > self.peak_requests:
            self.peak_requests = len(live)
            self.peak_prompts = [f"{decode(s.prompt)[:40]} ({len(s.made)}/{s.target})" for s in live]

    def open_requests(self) -> int:
        """Generation requests open now (running or waiting, their clients still there)."""
        return sum(1 for s in (*self.waiting, *self.running) if not s.done and not s.gone)

    def _fill(self) -> None:
        while self.waiting and len(self.running) < self.slots:
            seq = self.waiting.popleft()
            if seq.gone:
                continue
            self.running.append(seq)
            self.peak = max(self.peak, len(self.running))
            if self.step_s <= 0:
                self._advance(seq, seq.target)
        self.running = [s for s in self.running if not s.done and not s.gone]
        if self.running and not self._ticking and self.step_s > 0:
            self._ticking = True
            asyncio.get_running_loop().call_later(self.step_s, self._tick)
        if self.waiting and len(self.running) < self.slots:
            self._fill()

    def _advance(self, seq: Seq, n: int) -> None:
        start = len(seq.made) + sum(1 for t in seq.prompt if t < BYTE_BASE)
        for i in range(n):
            seq.made.append(next_token(seq.seed, start + i))
        seq.wake.set()
        if seq.done:
            self.served += 1
            self._closed(seq)

    def _tick(self) -> None:
        self._ticking = False
        for seq in self.running:
            if not seq.done and not seq.gone:
                self._advance(seq, 1)
        self._fill()

    def _closed(self, seq: Seq) -> None:
        if seq in self.opened:
            self.opened.discard(seq)
            self.spans.append((seq.key or "", seq.opened, time.time()))

    def stop(self) -> None:
        """Stopping (SIGTERM): every request waiting or running ends now, as vLLM aborts
        them, rather than the process waiting for them all to finish; a stream ends without
        its end (its client sees a broken stream), a whole answer is a 503."""
        self.stopping = True
        for seq in (*self.waiting, *self.running):
            seq.gone = True
            seq.wake.set()
        self.waiting.clear()
        self.running.clear()

    def _leave(self, seq: Seq) -> None:
        """Its client left (vLLM aborts such a request): it leaves the queue or its slot, and
        its handler, waiting for its tokens, ends."""
        if not seq.done:
            seq.gone = True
            self._closed(seq)
            self.aborted += 1
            if seq in self.waiting:  # (the queue gauge counts those still waiting only)
                self.waiting.remove(seq)
            seq.wake.set()
            self._fill()

    # ------------------------------------------------------------ HTTP
    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        self.loop = asyncio.get_running_loop()
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path == "/stats":  # what tests read: peaks and counts
            stats: dict[str, object] = {
                "peak": self.peak,
                "peak_requests": self.peak_requests,
                "served": self.served,
                "open": self.open_requests(),
                "peak_prompts": self.peak_prompts,
                "aborted": self.aborted,
                "pid": os.getpid(),  # (which process: an engine a fleet launched)
                "asleep": self.asleep,
                "sleeps": self.sleeps,
                "wakes": self.wakes,
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                **(self.adapters.stats() if self.adapters is not None else {}),
            }
            await send_json(send, 200, stats)
            return
        if method == "GET" and path == "/spans":  # marked requests: ended, and open now
            spans = {"spans": list(self.spans), "open": [(q.key, q.opened) for q in self.opened]}
            await send_json(send, 200, spans)
            return
        if method == "GET" and path == "/metrics":  # (a few of vLLM's own)
            text = (
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{model_name="{self.model}"}} {len(self.running)}\n'
                "# TYPE vllm:num_requests_waiting gauge\n"
                f'vllm:num_requests_waiting{{model_name="{self.model}"}} {len(self.waiting)}\n'
                "# TYPE vllm:cache_config_info gauge\n"
                f'vllm:cache_config_info{{block_size="16",kv_cache_size_tokens="{self.kv_tokens}",'
                f'num_gpu_blocks="{self.kv_tokens // 16}"}} 1.0\n'
                "# TYPE vllm:prefix_cache_queries counter\n"
                f'vllm:prefix_cache_queries_total{{model_name="{self.model}"}} {self.prefix_queries}.0\n'
                "# TYPE vllm:prefix_cache_hits counter\n"
                f'vllm:prefix_cache_hits_total{{model_name="{self.model}"}} {self.prefix_hits}.0\n'
            )
            await send_text(send, 200, text)
            return
        if method == "GET" and path in ("/v1/models", "/health"):
            models = {
                "object": "list",
                # (vLLM says its context length here)
                "data": [
                    {
                        "id": self.model,
                        "object": "model",
                        "owned_by": "standin",
                        "max_model_len": MAX_MODEL_LEN,
                    },
                    *(self.adapters.models() if self.adapters is not None else ()),
                ],
            }
            await send_json(send, 200, models)
            return
        if self.sleep_mode and path in ("/sleep", "/wake_up", "/is_sleeping"):
            await self._sleep_mode(send, method, path)
            return
        if self.asleep and path != "/detokenize":
            await send_json(
                send, 503, {"error": {"message": "the engine is asleep", "type": "ServiceUnavailable"}}
            )
            return
        lora = path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter") and self.adapters is not None
        if method != "POST" or not (
            lora or path in ("/v1/completions", "/v1/chat/completions", "/detokenize")
        ):
            await send_json(
                send, 404, {"error": {"message": f"no route {method} {path}", "type": "NotFound"}}
            )
            return
        raw = b""
        while True:
            msg = await receive()
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        try:
            body = json.loads(raw)
            if path == "/detokenize":
                await send_json(send, 200, {"prompt": decode(list(body["tokens"]))})
                return
            if lora:
                assert self.adapters is not None
                status, said = await self.adapters.call(path, body)
                await (
                    send_text(send, status, said) if isinstance(said, str) else send_json(send, status, said)
                )
                return
            seq, meta = self._parse(body, chat=path.endswith("chat/completions"))
        except (ValueError, KeyError, TypeError) as exc:
            await send_json(
                send, 400, {"error": {"message": f"bad request: {exc}", "type": "BadRequestError"}}
            )
            return
        self._admit(seq)
        watch = None if seq.done else asyncio.get_running_loop().create_task(_watch(receive, seq, self))
        try:
            if meta["stream"]:
                await self._stream(send, seq, meta)
            else:
                while not seq.done and not seq.gone:
                    seq.wake.clear()
                    await seq.wake.wait()
                if not seq.gone:
                    await send_json(send, 200, answer(seq, meta))
                elif self.stopping:
                    error = {"message": "the engine is stopping", "type": "ServiceUnavailable"}
                    await send_json(send, 503, {"error": error})
        finally:
            if watch is not None:
                watch.cancel()

    async def _sleep_mode(self, send: Any, method: str, path: str) -> None:
        if method == "GET" and path == "/is_sleeping":
            await send_json(send, 200, {"is_sleeping": self.asleep})
        elif method == "POST" and path == "/sleep":
            self.asleep = True
            self.sleeps += 1
            await send_json(send, 200, {})
        elif method == "POST" and path == "/wake_up":
            await asyncio.sleep(self.wake_s)
            self.asleep = False
            self.wakes += 1
            await send_json(send, 200, {})
        else:
            await send_json(send, 405, {"error": {"message": f"{method} {path}", "type": "MethodNotAllowed"}})

    def _parse(self, body: dict[str, Any], *, chat: bool) -> tuple[Seq, dict[str, Any]]:
        refused = sorted(self.refuse & body.keys())
        if refused:
            raise ValueError(f"{refused[0]} is not supported")
        if not isinstance(body.get("prompt", ""), str) and "prompt_ids" in self.refuse:
            raise ValueError("a prompt of token ids is not supported")
        model = body.get("model")
        adapter = self.adapters is not None and self.adapters.serves(model)
        if model != self.model and not adapter:
            raise ValueError(f"model {model!r} is not served (try {self.model!r})")
        if chat:
            text = chat_prompt(body["messages"], not body.get("continue_final_message"))
            ids = encode(text)
        elif isinstance(body["prompt"], str):
            ids = encode(body["prompt"])
        elif isinstance(body["prompt"], list) and all(type(t) is int for t in body["prompt"]):
            ids = list(body["prompt"])
        else:
            raise ValueError("the stand-in serves one prompt: a string or a list of token ids")
        if body.get("n") not in (None, 1):
            raise ValueError("the stand-in makes one choice (n = 1)")
        seed = zlib.crc32(bytes(t - BYTE_BASE for t in ids if t >= BYTE_BASE))
        if adapter:  # (an adapter writes other words than its base)
            seed = zlib.crc32(str(model).encode(), seed)
        self._look_up(ids)
        # (as vLLM: a chat's max_completion_tokens first)
        target = int(body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS)
        if len(ids) >= MAX_MODEL_LEN:  # (as vLLM: a prompt over the context is refused)
            raise ValueError(f"the prompt is {len(ids)} tokens, over the context of {MAX_MODEL_LEN}")
        target = min(target, MAX_MODEL_LEN - len(ids))  # (and what would run past it ends there)
        options = body.get("stream_options") or {}
        self.priorities.append(body.get("priority"))
        meta = {
            "chat": chat,
            "stream": bool(body.get("stream")),
            "usage": bool(options.get("include_usage")),
            "ids": bool(body.get("return_token_ids")),
            "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:16],
            "created": int(time.time()),
            "model": model,
        }
        return Seq(ids, target, seed), meta

    def _look_up(self, ids: list[int]) -> None:
        """A prompt comes in: its leading full blocks found in the cache are counted, then
        it is held (its head most recently used, as vLLM frees a request's blocks tail first)."""
        chain, h = [], 0
        for i in range(CACHE_BLOCK, len(ids) + 1, CACHE_BLOCK):
            h = hash((h, *ids[i - CACHE_BLOCK : i]))
            chain.append(h)
        cache = self.cache
        found = next((n for n, b in enumerate(chain) if b not in cache), len(chain))
        self.prefix_queries += len(ids)
        self.prefix_hits += found * CACHE_BLOCK
        for b in reversed(chain):
            cache[b] = None
            cache.move_to_end(b)
        while len(cache) > self.kv_tokens // CACHE_BLOCK:
            cache.popitem(last=False)

    async def _stream(self, send: Any, seq: Seq, meta: dict[str, Any]) -> None:
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        sent = 0
        first = True
        if meta["chat"]:  # a role chunk first, as vLLM sends it
            await send_sse(send, chunk(seq, meta, [], first=True))
            first = False
        while not seq.gone:
            if sent == len(seq.made):
                if seq.done:
                    break
                seq.wake.clear()
                await seq.wake.wait()
                continue
            new = seq.made[sent:]
            sent = len(seq.made)
            await send_sse(send, chunk(seq, meta, new, first))
            first = False
        if self.stopping:  # (cut short: no usage, no [DONE])
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        if meta["usage"] and not seq.gone:
            obj = "chat.completion.chunk" if meta["chat"] else "text_completion"
            await send_sse(send, {**head(meta, obj), "choices": [], "usage": usage(seq)})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


async def _watch(receive: Any, seq: Seq, app: StandIn) -> None:
    """The client went away: its sequence stops and its slot is free at once."""
    while (await receive())["type"] != "http.disconnect":
        pass
    app._leave(seq)
    seq.wake.set()


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    ap = OneLine(prog="python -m laneway.standin", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=port, default=8001)
    ap.add_argument("--slots", type=positive_int, default=4)
    ap.add_argument("--ms-per-token", type=seconds, default=2.0)
    ap.add_argument("--model", default="standin")
    ap.add_argument(
        "--refuse",
        action="append",
        default=[],
        metavar="FIELD",
        help="answer 400 to requests with this field, as an engine without it "
        "(return_token_ids, continue_final_message; prompt_ids: a prompt of token ids)",
    )
    ap.add_argument(
        "--load-s",
        type=seconds,
        default=0.0,
        help="seconds before it listens, as an engine loading its model (a fleet's switch cost)",
    )
    ap.add_argument(
        "--enable-sleep-mode",
        action="store_true",
        help="vLLM's sleep mode: POST /sleep, POST /wake_up, GET /is_sleeping",
    )
    ap.add_argument("--wake-s", type=seconds, default=0.0, help="seconds a /wake_up takes")
    ap.add_argument(
        "--enable-lora",
        action="store_true",
        help="LoRA adapters loaded at run time (with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, as vLLM): "
        "POST /v1/load_lora_adapter, POST /v1/unload_lora_adapter",
    )
    ap.add_argument("--lora-load-s", type=seconds, default=0.0, help="seconds loading an adapter takes")
    ap.add_argument(
        "--ignore-stop",
        action="store_true",
        help="ignore SIGTERM and SIGINT, as an engine stuck in a driver call (only SIGKILL stops it)",
    )
    args = ap.parse_args(argv)
    if args.load_s > 0:
        print(f"standin: loading {args.model} for {args.load_s:g} s", flush=True)
        time.sleep(args.load_s)
    app = StandIn(
        args.model,
        args.slots,
        args.ms_per_token,
        tuple(args.refuse),
        sleep_mode=args.enable_sleep_mode,
        wake_s=args.wake_s,
        adapters=Adapters(args.model, args.lora_load_s) if args.enable_lora and runtime_updating() else None,
    )
    print(f"standin: serving {args.model} on http://{args.host}:{args.port}/v1", flush=True)
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level="warning", access_log=False, lifespan="on"
    )

    class Server(uvicorn.Server):
        """uvicorn's server, whose stop (SIGTERM, SIGINT) first ends what the app runs."""

        def handle_exit(self, sig: int, frame: Any) -> None:
            if args.ignore_stop:
                return
            if app.loop is not None and not app.stopping:
                app.loop.call_soon_threadsafe(app.stop)
            super().handle_exit(sig, frame)

    Server(config).run()


if __name__ == "__main__":
    main()
