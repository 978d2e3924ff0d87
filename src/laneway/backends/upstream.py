"""An OpenAI-compatible server (vLLM, SGLang, llama.cpp, TGI, another laneway) as a worker.

A faithful proxy. Each upstream worker has a slot limit, so requests queue in
laneway rather than inside the engine. A job's body is what the client sent,
less laneway's own fields (:mod:`laneway.protocol.fields`): it goes to the
upstream as sent, with three changes. The model is the upstream's name for
it; the answer is always streamed, with usage, so that a preemption keeps
what was generated (a client that does not stream gets the whole answer,
assembled: :mod:`laneway.protocol.assemble`); and, where the engine gives
them (``token_ids = "vllm"``: vLLM and SGLang), the token ids are asked for
(``return_token_ids``), then removed from what the client sees unless it
asked for them itself. Chunks reach the client as the upstream sent them.

Preempting a job aborts its connection at once (the upstream aborts the
sequence) and frees the slot without waiting for a teardown. Resuming
(:mod:`laneway.backends.continuation`) continues from the token ids so far
through ``/completions`` (exact), or from the text so far where the upstream
gave no ids. A job whose state cannot be carried over (``Job.resume``:
``restart``) runs again from scratch. Usage counts are the upstream's own:
prompt tokens of the first run, completion tokens as the ids it sent (or
its usage, per run).

Errors map to the client's: an upstream 400/404/413 is that error with the
upstream's message; connection failures, timeouts, stalls (no byte for
``stall_timeout_s``), 429 and 5xx are :class:`UpstreamUnavailable`
(retryable: the runtime may run the request on another worker when nothing
was streamed yet).
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

from laneway.backends.base import Capacity, Health, Sink
from laneway.backends.continuation import as_chat_chunk, by_ids, by_text
from laneway.backends.http import Events, Exchange, HttpError, Pool, Timeout
from laneway.config.schema import TOKEN_ID_DIALECTS
from laneway.errors import BackendError, InvalidRequest, ModelNotFound, PayloadTooLarge, RequestError
from laneway.generation import (
    CHAT,
    COMPLETION,
    EMBEDDING,
    RESUME_NONE,
    RESUME_RESTART,
    Checkpoint,
    Delta,
    Done,
    Failed,
    Job,
    Stopped,
    Usage,
)
from laneway.protocol.assemble import Assembly

PATHS = {CHAT: "chat/completions", COMPLETION: "completions", EMBEDDING: "embeddings"}
PROBE_TIMEOUT_S = 2.0
MAX_ERROR_CHARS = 300


class UpstreamUnavailable(BackendError):
    """The upstream could not be reached, stalled, or answered 429/5xx; another worker may do."""

    retryable = True


@dataclass(eq=False)
class _Run:
    """A job on an upstream, over all its runs (a preempted job is resumed as a new run)."""

    job: Job
    sink: Sink
    text: str = ""  # choice 0's text so far
    tokens: int = 0  # completion tokens so far
    prompt_ids: list[int] | None = None
    out_ids: list[int] | None = None  # generated ids so far (None: the upstream gave none)
    prompt_tokens: int | None = None  # of the original prompt, once the upstream said
    usage: dict[str, Any] | None = None  # the upstream's last usage object (its details kept)
    assembly: Assembly | None = None  # the whole answer so far, for a client that does not stream
    runs: int = 0
    # this run
    via: str = ""  # the endpoint of this run (a chat job resumed by ids runs as a completion)
    continued: bool = False  # this run continues an earlier one
    open: int = 1  # choices not finished yet
    run_tokens: int = 0
    finish: str | None = None
    held: list[dict[str, Any]] = field(default_factory=list)  # the chunk that ends it (sent with Done)
    usage_chunk: dict[str, Any] | None = None
    exchange: Exchange | None = None
    task: asyncio.Task[None] | None = None


@dataclass
class _State:
    """An upstream job's checkpoint: the run so far."""

    run: _Run


class UpstreamWorker:
    features = frozenset({"passthrough"})

    def __init__(
        self,
        name: str,
        url: str | None,
        model: str,
        *,
        slots: int = 4,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        stall_timeout_s: float = 30.0,
        token_ids: str = "vllm",
        options: dict[str, Any] | None = None,
    ) -> None:
        if not url:
            raise InvalidRequest(f"worker {name}: an upstream needs a url")
        if token_ids not in TOKEN_ID_DIALECTS:
            raise ValueError(f"token_ids must be one of {', '.join(TOKEN_ID_DIALECTS)}")
        self.name = name
        self.model = model
        self.slots = slots
        self.base = url.rstrip("/")
        self.timeout_s = timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.token_ids = token_ids
        self.options = dict(options or {})  # extra body fields sent with every request
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._pool = Pool(url, headers=headers, connect_timeout_s=min(10.0, timeout_s), max_idle=slots + 4)
        self._runs: dict[str, _Run] = {}
        # vLLM serves /detokenize beside /v1, at the root
        self._detokenize = self._pool.target.path.removesuffix("/v1") + "/detokenize"

    def capacity(self) -> Capacity:
        return Capacity(self.slots, len(self._runs), (self.model,))

    def resume_method(self, job: Job) -> str:
        """How a preemption of ``job`` would resume here (the response's ``laneway.resume``)."""
        if job.resume == RESUME_NONE:
            return "none"
        if job.resume == RESUME_RESTART:
            return "restart"
        return "token_ids" if self.token_ids != "none" else "text"

    # ------------------------------------------------------------ protocol
    async def run(self, job: Job, sink: Sink) -> None:
        if job.body is None:  # a job made in code, not by a client: its request from its fields
            job = replace(job, body=request_body(job))
        self._start(_Run(job, sink, assembly=None if job.stream else Assembly()))

    async def resume(self, checkpoint: Checkpoint, sink: Sink) -> None:
        state = checkpoint.state
        if not isinstance(state, _State):
            raise BackendError(f"checkpoint of {checkpoint.job.id} was not made by an upstream worker")
        run = state.run
        run.sink = sink
        self._start(run)

    async def preempt(self, job_id: str, mode: str) -> None:
        run = self._runs.get(job_id)
        if run is None:
            return
        if run.held:  # its last chunk is in: it has ended, only its usage is on the way
            self._stop(job_id)
            self._runs[job_id] = run
            self._finished(run)
            return
        self._stop(job_id)
        run.tokens += run.run_tokens
        run.run_tokens = 0
        how = self.resume_method(run.job)
        if how == "token_ids" and (run.out_ids is None or run.prompt_ids is None):
            how = "text"  # the upstream gave no ids
        if how in ("restart", "none"):
            how = "restart"
            self._reset(run)
        ckpt = Checkpoint(run.job, how, run.tokens, run.text, 0, 0.0, _State(run))
        run.sink(Stopped(run.job.id, ckpt))

    async def cancel(self, job_id: str) -> None:
        run = self._stop(job_id)
        if run is not None:
            run.sink(Done(job_id, "cancelled", self._usage(run), run.text))

    def discard(self, checkpoint: Checkpoint) -> None:
        checkpoint.state = None

    async def health(self) -> Health:
        """The upstream answers ``/models`` and serves this worker's model."""
        try:
            got = await self._pool.fetch("GET", "models", timeout_s=PROBE_TIMEOUT_S)
        except HttpError as exc:
            return Health(False, f"{self.base}: {exc}", transient=isinstance(exc, Timeout))
        if got.status != 200:
            return Health(False, f"{self.base}/models answered {got.status}")
        try:
            served = [m.get("id") for m in json.loads(got.body).get("data", ())]
        except (ValueError, AttributeError, TypeError):
            return Health(False, f"{self.base}/models did not answer a model list")
        if self.model not in served:
            listed = ", ".join(str(s) for s in served) or "none"
            return Health(False, f"{self.base} does not serve model {self.model!r} (it serves: {listed})")
        return Health(True, f"{self.base}: {len(self._runs)}/{self.slots} slots busy")

    async def close(self) -> None:
        for job_id in list(self._runs):
            self._stop(job_id)
        await self._pool.close()

    # ------------------------------------------------------------ runs
    def _start(self, run: _Run) -> None:
        if run.job.id in self._runs:
            raise InvalidRequest(f"job {run.job.id!r} is already running on worker {self.name}")
        if len(self._runs) >= self.slots:
            raise BackendError(f"all {self.slots} slots of worker {self.name} are busy")
        self._runs[run.job.id] = run
        run.task = asyncio.get_running_loop().create_task(self._go(run))

    def _stop(self, job_id: str) -> _Run | None:
        """Take ``job_id`` off this worker now: its connection is dropped, its slot free."""
        run = self._runs.pop(job_id, None)
        if run is None:
            return None
        if run.exchange is not None:
            run.exchange.abort()
            run.exchange = None
        if run.task is not None:
            run.task.cancel()
            run.task = None
        return run

    def _reset(self, run: _Run) -> None:
        """Forget a run's progress: it starts again from scratch."""
        run.text, run.tokens, run.out_ids, run.prompt_ids, run.usage = "", 0, None, None, None
        run.runs = 0
        if run.assembly is not None:
            run.assembly = Assembly()

    def _body(self, run: _Run) -> tuple[str, dict[str, Any]]:
        """This run's endpoint and body."""
        job = run.job
        body: dict[str, Any] = {**self.options, **(job.body or {})}
        kind = job.kind
        run.continued = run.runs > 0 and (run.tokens > 0 or run.out_ids is not None)
        if kind == EMBEDDING:
            body["model"] = self.model
            return PATHS[kind], body
        via = kind
        if run.continued:
            if run.out_ids is not None and run.prompt_ids is not None:
                body = by_ids(body, kind, run.prompt_ids + run.out_ids, len(run.out_ids))
                via = COMPLETION
            else:
                body = by_text(body, kind, run.text, run.tokens)
        body["model"] = self.model
        body["stream"] = True
        options = job.body.get("stream_options") if job.body else None
        body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        if self.token_ids == "vllm" and not body.get("echo"):  # with echo, vLLM would blank the prompt
            body["return_token_ids"] = True
        run.via = via
        return PATHS[via], body

    async def _go(self, run: _Run) -> None:
        try:
            if run.job.kind == EMBEDDING:
                await self._embed(run)
            else:
                await self._generate(run)
        except asyncio.CancelledError:
            raise
        except RequestError as exc:
            self._end(run, Failed(run.job.id, exc))
        except HttpError as exc:
            self._end(run, Failed(run.job.id, UpstreamUnavailable(f"upstream {self.name}: {exc}")))
        except BackendError as exc:
            self._end(run, Failed(run.job.id, exc))

    async def _embed(self, run: _Run) -> None:
        path, body = self._body(run)
        raw = json.dumps(body, separators=(",", ":")).encode()
        got = await self._pool.fetch("POST", path, raw, timeout_s=self.timeout_s)
        if got.status != 200:
            raise _error_from(got.status, got.body, self.name)
        try:
            answer = json.loads(got.body)
            prompt = int((answer.get("usage") or {}).get("prompt_tokens") or 0)
        except (ValueError, AttributeError, TypeError):
            raise UpstreamUnavailable(
                f"upstream {self.name} answered an embedding that is not JSON"
            ) from None
        self._end(run, Done(run.job.id, "stop", Usage(prompt, 0), "", response=answer))

    async def _generate(self, run: _Run) -> None:
        path, body = self._body(run)
        if run.continued and run.via == COMPLETION and (run.job.body or {}).get("stop"):
            held = await self._held_text(run)
            if held is None and run.assembly is not None:
                # what the upstream held back cannot be read: the client has seen nothing
                # yet, so the request starts again from scratch (exact, at a cost)
                self._reset(run)
                path, body = self._body(run)
            else:
                self._catch_up(run, held or "")
        run.runs += 1
        run.open = _choices(run.job)
        run.run_tokens = 0
        run.finish = None
        run.held = []
        run.usage_chunk = None
        wants_ids = bool(run.job.body and run.job.body.get("return_token_ids"))
        done_seen = False

        def on_event(data: bytes) -> None:
            nonlocal done_seen
            if data == b"[DONE]":
                done_seen = True
                return
            if done_seen:
                return
            try:
                chunk = json.loads(data)
            except ValueError:
                raise UpstreamUnavailable(f"upstream {self.name} sent a chunk that is not JSON") from None
            self._chunk(run, chunk, wants_ids)

        reader = Events(on_event)
        raw = json.dumps(body, separators=(",", ":")).encode()
        exchange = await self._pool.request(
            "POST", path, raw, reader, stall_s=self.stall_timeout_s, accept=b"text/event-stream"
        )
        run.exchange = exchange
        timer = None
        if math.isfinite(self.timeout_s):
            late = HttpError(f"no complete answer within {self.timeout_s:g} s")
            timer = asyncio.get_running_loop().call_later(self.timeout_s, exchange.fail, late)
        try:
            await exchange.done
        finally:
            if timer is not None:
                timer.cancel()
            run.exchange = None
        if reader.status != 200:
            raise _error_from(reader.status, reader.error_body, self.name)
        self._finished(run)

    async def _held_text(self, run: _Run) -> str | None:
        """Text of tokens the upstream had sent the ids of but not yet the text when the run
        was stopped (vLLM holds the last characters back while they could still be part of
        a stop string), read with its ``/detokenize``. ``None`` when it cannot be told: no
        such endpoint, or special tokens in the output (``ignore_eos``), which
        ``/detokenize`` writes out and the stream does not."""
        assert run.prompt_ids is not None and run.out_ids is not None
        try:
            texts = []
            for ids in (run.prompt_ids + run.out_ids, run.prompt_ids):
                raw = json.dumps({"model": self.model, "tokens": ids}).encode()
                got = await self._pool.fetch("POST", self._detokenize, raw, timeout_s=PROBE_TIMEOUT_S)
                if got.status != 200:
                    return None
                texts.append(json.loads(got.body)["prompt"])
        except (HttpError, ValueError, KeyError, TypeError):
            return None
        full, head = texts
        if not isinstance(full, str) or not isinstance(head, str) or not full.startswith(head):
            return None
        made = full[len(head) :]
        return made[len(run.text) :] if made.startswith(run.text) else None

    def _catch_up(self, run: _Run, text: str) -> None:
        """Send ``text`` of the earlier run that the client has not had yet."""
        if not text:
            return
        job = run.job
        if job.kind == CHAT:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
            obj = "text_completion"
        chunk = {
            "id": job.id,
            "object": obj,
            "created": 0,
            "model": job.model,
            "choices": [{**choice, "finish_reason": None}],
        }
        run.text += text
        if run.assembly is not None:
            run.assembly.add(chunk)
            run.sink(Delta(job.id, text, run.tokens))
        else:
            run.sink(Delta(job.id, text, run.tokens, chunk=chunk))

    # ------------------------------------------------------------ chunks
    def _chunk(self, run: _Run, chunk: dict[str, Any], wants_ids: bool) -> None:
        if not isinstance(chunk, dict):
            raise UpstreamUnavailable(f"upstream {self.name} sent a chunk that is not an object")
        if "error" in chunk:
            err = chunk["error"]
            raise BackendError(f"upstream {self.name}: {_message(err)}")
        if "prompt_token_ids" in chunk:
            top_ids = chunk["prompt_token_ids"]
            if top_ids is not None and run.prompt_ids is None and not run.continued:
                run.prompt_ids = list(top_ids)
            if not wants_ids or run.continued:  # asked by laneway (or of the continuation): not shown
                chunk["prompt_token_ids"] = None
        if chunk.get("usage"):
            run.usage = chunk["usage"]
        choices = chunk.get("choices")
        if not choices:
            if "usage" in chunk:
                run.usage_chunk = chunk
                if run.assembly is not None:
                    run.assembly.add(chunk)  # its system_fingerprint belongs to the answer
            return
        job = run.job
        text = ""
        ends = 0
        for c in choices:
            ids = c.get("token_ids")
            pids = c.get("prompt_token_ids")
            if pids is not None and run.prompt_ids is None and not run.continued:
                run.prompt_ids = list(pids)
            if ids is not None:
                run.run_tokens += len(ids)
                if c.get("index", 0) == 0:
                    if run.out_ids is None:
                        run.out_ids = []
                    run.out_ids.extend(ids)
            # ids laneway asked for itself are not shown (vLLM sends the keys as null then)
            if not wants_ids:
                if "token_ids" in c:
                    c["token_ids"] = None
                if "prompt_token_ids" in c:
                    c["prompt_token_ids"] = None
            elif run.continued and "prompt_token_ids" in c:
                c["prompt_token_ids"] = None
            piece = c.get("text") if run.via == COMPLETION else (c.get("delta") or {}).get("content")
            if c.get("index", 0) == 0 and piece:
                text += piece
            if ids is None and piece:
                run.run_tokens += 1  # an upstream without ids: counted per chunk until its usage says
            if c.get("finish_reason") is not None:
                ends += 1
                if c.get("index", 0) == 0:
                    run.finish = c["finish_reason"]
        if run.continued:
            if job.kind == CHAT and run.via == COMPLETION:
                chunk = as_chat_chunk(chunk)
            elif job.kind == CHAT:
                _drop_role(chunk)
                if not chunk["choices"]:
                    return
        run.text += text
        counted = run.tokens + run.run_tokens
        run.open -= ends
        if ends and run.open <= 0:
            run.held.append(chunk)  # sent with Done, which carries the laneway object
            if run.assembly is not None:
                run.assembly.add(chunk)
            return
        if run.assembly is not None:
            run.assembly.add(chunk)
            run.sink(Delta(job.id, text, counted))
        else:
            run.sink(Delta(job.id, text, counted, chunk=chunk))

    def _finished(self, run: _Run) -> None:
        usage = run.usage or {}
        ran = usage.get("completion_tokens")
        if _count(ran):  # the upstream's own count for this run
            run.run_tokens = ran
        if run.prompt_tokens is None:
            prompt = usage.get("prompt_tokens")
            if _count(prompt) and not run.continued:
                run.prompt_tokens = prompt
            elif run.prompt_ids is not None:
                run.prompt_tokens = len(run.prompt_ids)
            elif _count(prompt):  # a run resumed by text had the text so far in its prompt
                run.prompt_tokens = max(prompt - run.tokens, 0)
        run.tokens += run.run_tokens
        run.run_tokens = 0
        u = self._usage(run)
        totals = {
            **usage,
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens,
        }
        finish = run.finish or "stop"
        if run.assembly is not None:
            answer = run.assembly.answer(totals)
            self._end(run, Done(run.job.id, finish, u, run.text, response=answer))
            return
        chunks = list(run.held)
        uc = run.usage_chunk
        options = (run.job.body or {}).get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            if uc is None:
                uc = {"object": chunks[-1].get("object") if chunks else "text_completion", "choices": []}
            uc["usage"] = totals
            chunks.append(uc)
        elif uc is not None and uc.get("system_fingerprint") and chunks:
            chunks[-1].setdefault("system_fingerprint", uc["system_fingerprint"])
        self._end(run, Done(run.job.id, finish, u, run.text, chunks=tuple(chunks)))

    def _usage(self, run: _Run) -> Usage:
        return Usage(run.prompt_tokens or 0, run.tokens + run.run_tokens)

    def _end(self, run: _Run, event: Done | Failed) -> None:
        if self._runs.get(run.job.id) is run:
            del self._runs[run.job.id]
            run.task = None
            run.sink(event)


def request_body(job: Job) -> dict[str, Any]:
    """The OpenAI request a job made in code stands for (its sampling parameters, as given)."""
    p = job.params
    body: dict[str, Any] = {"temperature": p.temperature, "top_p": p.top_p}
    if p.max_tokens is not None:
        body["max_tokens"] = p.max_tokens
    if p.seed is not None:
        body["seed"] = p.seed
    if p.stop:
        body["stop"] = list(p.stop)
    if p.ignore_eos:
        body["ignore_eos"] = True
    if job.kind == CHAT:
        body["messages"] = [dict(m) for m in job.messages or ()]
        if job.continue_final:
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
    elif job.kind == COMPLETION:
        body["prompt"] = job.prompt
    return body


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _choices(job: Job) -> int:
    """How many choices an answer has: ``n`` per prompt."""
    body = job.body or {}
    n = body.get("n")
    n = n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1
    prompt = body.get("prompt")
    prompts = 1
    if isinstance(prompt, list) and prompt and not all(isinstance(t, int) for t in prompt):
        prompts = len(prompt)
    return n * prompts


def _drop_role(chunk: dict[str, Any]) -> None:
    """A chat run resumed by text announces the role again: the client already has it."""
    kept = []
    for c in chunk.get("choices") or ():
        delta = c.get("delta")
        if isinstance(delta, dict):
            delta.pop("role", None)
            empty = not delta or delta == {"content": ""}
            if empty and c.get("finish_reason") is None and not c.get("logprobs") and "token_ids" not in c:
                continue
        kept.append(c)
    chunk["choices"] = kept


def _message(err: Any) -> str:
    return str(err.get("message") or err) if isinstance(err, dict) else str(err)


def _error_from(status: int, raw: bytes, name: str) -> Exception:
    """The client-facing error for an upstream's error answer."""
    try:
        message = _message(json.loads(raw)["error"])
    except (ValueError, KeyError, TypeError):
        message = raw.decode("utf-8", "replace")[:MAX_ERROR_CHARS] or f"HTTP {status}"
    text = f"upstream {name}: {message}"
    if status == 404:
        return ModelNotFound(text)
    if status == 413:
        return PayloadTooLarge(text)
    if 400 <= status < 500 and status not in (401, 403, 408, 429):
        return InvalidRequest(text)
    return UpstreamUnavailable(f"{text} (HTTP {status})")
