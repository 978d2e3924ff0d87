"""What an upstream's stream means for a job, over every run of it.

A job on an upstream may run several times (a preempted one is resumed as a
new run): :class:`Run` keeps what all of them made — the text, the token ids,
the usage, the whole answer for a client that does not stream — and turns
each chunk of the current run into the job's events: a ``Delta`` carrying the
chunk to forward (cleaned of the ids laneway asked for itself, turned back
into a chat chunk for a chat job resumed through ``/completions``), or, for
the chunk that ends the answer, kept for the ``Done`` (which carries the
``laneway`` object).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from laneway.backends.base import Sink
from laneway.backends.continuation import as_chat_chunk
from laneway.backends.http import Exchange
from laneway.errors import BackendError
from laneway.generation import CHAT, COMPLETION, Checkpoint, Delta, Done, Job, Usage
from laneway.protocol.assemble import Assembly

log = logging.getLogger("laneway.backends")


MAX_TOKENS = 10_000_000  # more tokens than any context holds: a count past it is not believed


class UpstreamUnavailable(BackendError):
    """The upstream could not be reached, stalled, or answered 429/5xx; another worker may do.

    ``worker_fault``: whether it says the worker is unwell (it is taken out of placement
    until a probe succeeds). An upstream that *answered* 500 (or another 5xx but 502–504)
    is up: that is one request's failure, which must not take the worker away from others.
    ``malformed``: it answered, with something that is no answer (a 200 that is not a
    stream, an event that is not JSON, a stream that ends before its answer); ``False``
    where it could not be reached, stalled, or said it is busy or behind a proxy that
    cannot reach it (429, 502–504). A fleet's own engine that answers so is up: it stays
    in placement, and is stopped once its answers keep failing (:mod:`laneway.runtime.fleet_faults`).
    """

    def __init__(
        self, message: str, *, worker_fault: bool = True, malformed: bool = True, retryable: bool = True
    ) -> None:
        super().__init__(message)
        self.retryable = retryable  # (False: an answered 500, that request's own failure)
        self.worker_fault = worker_fault
        self.malformed = malformed
        self.checkpoint: Checkpoint | None = None  # where the run stopped, if it may go on elsewhere
        self.unsent = False  # it never reached the engine (no connection): a try that cost nothing
        self.cut = False  # the engine broke its answer off: it may be gone (probed at once)


class EngineError(BackendError):
    """The upstream sent an error inside its stream (``{"error": …}``, a Responses
    ``error`` event): its ``error`` object, for the client's error
    (:func:`~laneway.backends.upstream_errors.engine_error`)."""

    def __init__(self, source: str, error: object) -> None:
        super().__init__(f"upstream {source}: {message_of(error)}")
        self.error = error


@dataclass(eq=False)
class Run:
    """A job on an upstream, over all its runs."""

    job: Job
    sink: Sink
    source: str  # the worker, for messages
    text: str = ""  # choice 0's text so far
    tokens: int = 0  # completion tokens so far, over the runs that ended
    prompt_ids: list[int] | None = None
    out_ids: list[int] | None = None  # generated ids so far (None: the upstream gave none)
    prompt_tokens: int | None = None  # of the original prompt, once the upstream said
    usage: dict[str, Any] | None = None  # the upstream's last usage object (its details kept)
    assembly: Assembly | None = None  # the whole answer so far, for a client that does not stream
    runs: int = 0
    # this run
    via: str = ""  # the endpoint of this run (a chat job resumed by ids runs as a completion)
    continued: bool = False  # this run continues an earlier one
    added_ids: bool = False  # laneway asked for token ids in this run (the client did not)
    without_ids: bool = False  # a 400 came when they were asked: this job asks no more
    by: str = ""  # how this run continues an earlier one: "ids", "text" ("": it does not)
    open: int = 1  # choices not finished yet
    run_tokens: int = 0
    finish: str | None = None
    held: list[dict[str, Any]] = field(default_factory=list)  # the chunk that ends it (sent with Done)
    usage_chunk: dict[str, Any] | None = None
    exchange: Exchange | None = None
    task: asyncio.Task[None] | None = None
    context: int | None = None  # the model's context length, where the upstream says it

    @property
    def most_tokens(self) -> int:
        """The most completion tokens this run may make: ``max_tokens`` (or the context)
        for each choice, less what the runs before it made. An upstream that streams more,
        or says it made more, is wrong."""
        params = self.job.params
        limit = params.max_tokens if params.max_tokens is not None else (self.context or MAX_TOKENS)
        return max(1, max(1, limit) * choices_of(self.job) - self.tokens)

    @property
    def all_made(self) -> bool:
        """Whether every token the client asked for (``max_tokens``) was made: nothing is
        left for a run to go on with."""
        limit = self.job.params.max_tokens
        return limit is not None and self.tokens + self.run_tokens >= limit * choices_of(self.job)

    @property
    def wants_ids(self) -> bool:
        """Whether the client asked for token ids itself (else laneway's own are not shown)."""
        return bool(self.job.body and self.job.body.get("return_token_ids"))

    def begin(self) -> None:
        """A new run starts (its endpoint and ``continued`` are set)."""
        self.runs += 1
        self.open = choices_of(self.job)
        self.run_tokens = 0
        self.finish = None
        self.held = []
        self.usage_chunk = None

    def stopped(self) -> None:
        """The run was stopped (preempted): what it made counts from now on."""
        self.tokens += self.run_tokens
        self.run_tokens = 0

    def reset(self) -> None:
        """Forget the progress: the job starts again from scratch."""
        self.text, self.tokens, self.out_ids, self.prompt_ids, self.usage = "", 0, None, None, None
        self.runs = 0
        if self.assembly is not None:
            self.assembly = Assembly()

    def usage_so_far(self) -> Usage:
        return Usage(self.prompt_tokens or 0, self.tokens + self.run_tokens)

    def catch_up(self, text: str) -> None:
        """Send ``text`` of the earlier run that the client has not had yet."""
        if not text:
            return
        job = self.job
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
        self.text += text
        if self.assembly is not None:
            self.assembly.add(chunk)
            self.sink(Delta(job.id, text, self.tokens))
        else:
            self.sink(Delta(job.id, text, self.tokens, chunk=chunk))

    def take(self, chunk: dict[str, Any]) -> None:
        """One chunk of this run: note its ids and usage, then forward it (or keep it)."""
        wants_ids = self.wants_ids
        if not isinstance(chunk, dict):
            raise UpstreamUnavailable(f"upstream {self.source} sent a chunk that is not an object")
        if "error" in chunk:
            raise EngineError(self.source, chunk["error"])
        if "prompt_token_ids" in chunk:
            top_ids = chunk["prompt_token_ids"]
            if top_ids is not None and self.prompt_ids is None and not self.continued:
                self.prompt_ids = list(top_ids)
            if not wants_ids or self.continued:  # asked by laneway (or of the continuation): not shown
                chunk["prompt_token_ids"] = None
        usage = chunk.get("usage")
        if isinstance(usage, dict) and usage:
            self.usage = usage
        elif usage is not None and not isinstance(usage, dict):
            chunk["usage"] = None  # (not passed on: the client gets laneway's own count)
        choices = chunk.get("choices")
        if not choices:
            if self.continued and self.job.kind == CHAT and self.via == COMPLETION:
                chunk["object"] = "chat.completion.chunk"  # (a chat's usage, made by /completions)
            if "usage" in chunk:
                self.usage_chunk = chunk
                if self.assembly is not None:
                    self.assembly.add(chunk)  # its system_fingerprint belongs to the answer
            return
        job = self.job
        text = ""
        ends = 0
        if not isinstance(choices, list):
            raise UpstreamUnavailable(f"upstream {self.source} sent a chunk whose choices are not a list")
        for c in choices:
            self._check_choice(c)
            ids = c.get("token_ids")
            pids = c.get("prompt_token_ids")
            if pids is not None and self.prompt_ids is None and not self.continued:
                self.prompt_ids = list(pids)
            if ids is not None:
                self.run_tokens += len(ids)
                if c.get("index", 0) == 0:
                    if self.out_ids is None:
                        self.out_ids = []
                    self.out_ids.extend(ids)
            # ids laneway asked for itself are not shown (vLLM sends the keys as null then)
            if not wants_ids:
                if "token_ids" in c:
                    c["token_ids"] = None
                if "prompt_token_ids" in c:
                    c["prompt_token_ids"] = None
            elif self.continued and "prompt_token_ids" in c:
                c["prompt_token_ids"] = None
            piece = c.get("text") if self.via == COMPLETION else (c.get("delta") or {}).get("content")
            if c.get("index", 0) == 0 and piece:
                text += piece
            if ids is None and piece:
                self.run_tokens += 1  # an upstream without ids: counted per chunk until its usage says
            if c.get("finish_reason") is not None:
                ends += 1
                if c.get("index", 0) == 0:
                    self.finish = c["finish_reason"]
        if self.run_tokens > self.most_tokens:
            raise overrun(
                f"upstream {self.source} streamed {self.run_tokens} tokens where at most "
                f"{self.most_tokens} were asked"
            )
        if self.continued:
            if job.kind == CHAT and self.via == COMPLETION:
                chunk = as_chat_chunk(chunk)
            elif job.kind == CHAT:
                _drop_role(chunk)
                if not chunk["choices"]:
                    return
        self.text += text
        counted = self.tokens + self.run_tokens
        self.open -= ends
        if ends and self.open <= 0:
            self.held.append(chunk)  # sent with Done, which carries the laneway object
            if self.assembly is not None:
                self.assembly.add(chunk)
            return
        if self.assembly is not None:
            self.assembly.add(chunk)
            self.sink(Delta(job.id, text, counted))
        else:
            self.sink(Delta(job.id, text, counted, chunk=chunk))

    def _check_choice(self, c: object) -> None:
        """A chunk's choice is what the API says it is (else the answer is no answer: tried
        again, then a 502 naming the upstream), before anything of it is taken."""
        if not isinstance(c, dict):
            raise UpstreamUnavailable(f"upstream {self.source} sent a choice that is not an object")
        index = c.get("index", 0)
        delta = c.get("delta") if self.via != COMPLETION else None
        if self.via == COMPLETION:
            piece = c.get("text")
        else:
            piece = delta.get("content") if isinstance(delta, dict) else None
        ids, pids = c.get("token_ids"), c.get("prompt_token_ids")
        checks = (
            ("index", isinstance(index, int) and not isinstance(index, bool)),
            ("delta", delta is None or isinstance(delta, dict)),
            ("text", piece is None or isinstance(piece, str)),
            ("finish_reason", isinstance(c.get("finish_reason"), str | None)),
            ("token_ids", ids is None or _ints(ids)),
            ("prompt_token_ids", pids is None or _ints(pids)),
        )
        wrong = next((name for name, ok in checks if not ok), None)
        if wrong is not None:
            raise UpstreamUnavailable(
                f"upstream {self.source} sent a choice whose {wrong} is not what it should be"
            )

    def ended(self) -> Done:
        """The end of this run's stream: the job's ``Done``, with the upstream's usage where
        it is believable (a count, at least what was streamed, at most what was asked: it
        charges a tenant's budget), else laneway's own count of what was streamed."""
        usage = self.usage or {}
        ran = usage.get("completion_tokens")
        if plausible(ran, self.run_tokens, self.most_tokens):  # the upstream's own count for this run
            self.run_tokens = ran
        elif "completion_tokens" in usage:
            log.warning(
                "upstream %s: usage completion_tokens %.40r not believed (%d streamed); %d counted",
                self.source,
                ran,
                self.run_tokens,
                self.run_tokens,
            )
        if self.prompt_tokens is None:
            prompt = usage.get("prompt_tokens")
            counted = (
                prompt if plausible(prompt, 0, (self.context or MAX_TOKENS) * choices_of(self.job)) else None
            )
            if counted is not None and not self.continued:
                self.prompt_tokens = counted
            elif self.prompt_ids is not None:
                self.prompt_tokens = len(self.prompt_ids)
            elif counted is not None:  # a run resumed by text had the text so far in its prompt
                self.prompt_tokens = max(counted - self.tokens, 0)
        self.tokens += self.run_tokens
        self.run_tokens = 0
        u = self.usage_so_far()
        totals = {
            **usage,
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens,
        }
        finish = self.finish or "stop"
        if self.assembly is not None:
            answer = self.assembly.answer(totals)
            return Done(self.job.id, finish, u, self.text, response=answer)
        chunks = list(self.held)
        uc = self.usage_chunk
        options = (self.job.body or {}).get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            if uc is None:
                uc = {"object": chunks[-1].get("object") if chunks else "text_completion", "choices": []}
            uc["usage"] = totals
            chunks.append(uc)
        elif uc is not None and uc.get("system_fingerprint") and chunks:
            chunks[-1].setdefault("system_fingerprint", uc["system_fingerprint"])
        return Done(self.job.id, finish, u, self.text, chunks=tuple(chunks))


def _ints(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)


def overrun(message: str) -> UpstreamUnavailable:
    """An upstream streamed more tokens than asked: its answer is wrong, and going on with
    it elsewhere would only add to it (the request fails: 502 naming the upstream)."""
    return UpstreamUnavailable(message, worker_fault=False, retryable=False)


def plausible(value: object, low: int, high: int) -> TypeGuard[int]:
    """``value`` is a token count between ``low`` and ``high``."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def choices_of(job: Job) -> int:
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


def message_of(err: Any) -> str:
    return str(err.get("message") or err) if isinstance(err, dict) else str(err)
