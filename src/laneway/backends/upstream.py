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
upstream's message; connection failures, stalls (no byte for
``stall_timeout_s``), 429 and 5xx are :class:`UpstreamUnavailable`
(retryable: the runtime may run the request on another worker when nothing
was streamed yet). A run longer than ``timeout_s`` is :class:`UpstreamTimeout`
(504): the request ends, and the worker, slow but not gone, stays in placement.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from laneway.backends.base import Capacity, EngineState, Health, Sink
from laneway.backends.continuation import request_body
from laneway.backends.http import (
    Collect,
    Connect,
    Cut,
    Events,
    HttpError,
    Pool,
    Stale,
    Timeout,
    TooLarge,
    Unreached,
)
from laneway.backends.upstream_body import PATHS, Bodies
from laneway.backends.upstream_errors import (
    describe_body,
    engine_error,
    error_from,
    relay_error,
    stream_failure,
)
from laneway.backends.upstream_probe import Probe
from laneway.backends.upstream_relay import Passed, Relayed, whole
from laneway.backends.upstream_run import MAX_TOKENS, EngineError, Run, UpstreamUnavailable, plausible
from laneway.config.schema import TOKEN_ID_DIALECTS
from laneway.errors import (
    BackendError,
    InvalidRequest,
    RequestError,
    UpstreamTimeout,
)
from laneway.generation import (
    CHAT,
    COMPLETION,
    EMBEDDING,
    RELAY,
    RESPONSES,
    Checkpoint,
    Done,
    Failed,
    Job,
    ResumeMethod,
    Stopped,
    Usage,
)
from laneway.protocol import json_fast
from laneway.protocol.assemble import Assembly

__all__ = ["UpstreamUnavailable", "UpstreamWorker"]

log = logging.getLogger("laneway.backends")


@dataclass
class _State:
    """An upstream job's checkpoint: the run so far."""

    run: Run


class UpstreamWorker:
    features = frozenset({"passthrough"})
    engine_name = "an upstream engine"
    can_checkpoint = False  # (a preempted request resumes by recompute: from its tokens or text)
    engine: object | None = None

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
        connect: Connect | None = None,
        forward_priority: bool = False,
    ) -> None:
        """``connect``: how connections to the upstream are made (by default to its URL's host
        and port; :class:`~laneway.backends.inprocess.InProcess`: to an app in this process).
        ``forward_priority``: each request carries its class as vLLM's ``priority`` (for an
        engine started with ``--scheduling-policy priority``)."""
        if not url:
            raise InvalidRequest(f"worker {name}: an upstream needs a url")
        if token_ids not in TOKEN_ID_DIALECTS:
            raise ValueError(f"token_ids must be one of {', '.join(TOKEN_ID_DIALECTS)}")
        self.name = name
        self.model = model
        self.slots = slots
        # in a cluster the leader counts its slots (over every replica, by its configuration):
        # what it starts here runs, one over ``slots`` said once in the log
        self.counted_elsewhere = False
        self._said_over = False
        # awaited before each call with the model it names (a fleet: until the LoRA adapter
        # it names is loaded into this engine; what it raises ends the run)
        self.gate: Callable[[str], Awaitable[None]] | None = None
        self.base = url.rstrip("/")
        self.timeout_s = timeout_s
        self.stall_timeout_s = stall_timeout_s
        # what its runs send, and what the engine takes (learnt)
        self.bodies = Bodies(
            name, model, token_ids=token_ids, options=dict(options or {}), forward_priority=forward_priority
        )
        self.caps = self.bodies.caps
        # the W3C traceparent a job's call carries, by job id (set where traces are on)
        self.trace: Callable[[str], str | None] | None = None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._pool = Pool(
            url, headers=headers, connect_timeout_s=min(10.0, timeout_s), max_idle=slots + 4, connect=connect
        )
        self.probe = Probe(self._pool, self.base, model, self.caps)
        self._runs: dict[str, Run] = {}

    @property
    def max_model_len(self) -> int | None:
        """The context the upstream serves, as its ``/models`` says (vLLM's field)."""
        return self.probe.context

    @property
    def adapters(self) -> frozenset[str]:
        """LoRA adapters a job may name as its model (a fleet's engine: those loaded)."""
        return self.bodies.adapters

    @adapters.setter
    def adapters(self, names: frozenset[str]) -> None:
        self.bodies.adapters = names

    def capacity(self) -> Capacity:
        return Capacity(self.slots, len(self._runs), (self.model,))

    def capabilities(self) -> dict[str, object] | None:
        return self.caps.as_dict()

    def admit(self, job: Job) -> None:
        return None  # (the engine checks: vLLM caps a max_tokens past its context, refuses a prompt)

    def resume_method(self, job: Job) -> ResumeMethod:
        """How a preemption of ``job`` would resume here (the response's ``laneway.resume``),
        as far as what the engine takes is known."""
        return self.bodies.resume_method(job)

    # ------------------------------------------------------------ protocol
    async def run(self, job: Job, sink: Sink) -> None:
        if job.body is None:  # a job made in code, not by a client: its request from its fields
            job = replace(job, body=request_body(job))
        self._start(Run(job, sink, self.name, assembly=None if job.stream else Assembly()))

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
            self._end(run, run.ended())
            return
        if run.all_made:
            return  # every token is in, its end on the way: stopping it now would run it twice
        how = self.resume_method(run.job)
        if how is ResumeMethod.TOKEN_IDS and (run.out_ids is None or run.prompt_ids is None):
            how = ResumeMethod.TEXT  # the upstream gave no ids
            if run.job.kind == CHAT and self.caps.continue_final is False:
                how = ResumeMethod.RESTART if run.assembly is not None else ResumeMethod.NONE
        if how is ResumeMethod.NONE and run.assembly is None and (run.tokens or run.run_tokens):
            return  # its client reads what it made, and nothing could resume it: it runs on
        self._stop(job_id)
        run.stopped()
        if how is ResumeMethod.RESTART or how is ResumeMethod.NONE:
            how = ResumeMethod.RESTART
            run.reset()
        ckpt = Checkpoint(run.job, how, run.tokens, run.text, 0, 0.0, _State(run))
        run.sink(Stopped(run.job.id, ckpt))

    async def cancel(self, job_id: str) -> None:
        run = self._stop(job_id)
        if run is not None:
            run.sink(Done(job_id, "cancelled", run.usage_so_far(), run.text))

    def discard(self, checkpoint: Checkpoint) -> None:
        checkpoint.state = None

    async def health(self) -> Health:
        """The upstream answers ``/models`` and serves this worker's model."""
        return await self.probe.health(f"{len(self._runs)}/{self.slots} slots busy")

    async def engine_load(self) -> int | None:
        """The requests the engine runs or queues for this worker's model, by its own count
        (all of its clients'); ``None`` where it gives none."""
        state = await self.probe.state()
        return None if state is None else state.running + state.waiting

    async def engine_state(self) -> EngineState | None:
        """Its engine's running and waiting requests and KV use, by its own ``/metrics``."""
        return await self.probe.state()

    async def close(self) -> None:
        """Close it. A run still on it (a worker removed while a dispatch to it raced the
        removal) ends failed, retryable, from where it stopped: never without an end."""
        for job_id in list(self._runs):
            run = self._stop(job_id)
            if run is not None:
                err = UpstreamUnavailable(f"upstream {self.name} was closed", worker_fault=False)
                err.checkpoint = self._resumable(run)
                run.sink(Failed(job_id, err))
        self.probe.close()
        await self._pool.close()

    # ------------------------------------------------------------ runs
    def _start(self, run: Run) -> None:
        run.context = self.max_model_len
        if run.job.id in self._runs:
            raise InvalidRequest(f"job {run.job.id!r} is already running on worker {self.name}")
        if len(self._runs) >= self.slots:
            if not self.counted_elsewhere:
                raise BackendError(f"all {self.slots} slots of worker {self.name} are busy")
            if not self._said_over:
                self._said_over = True
                log.warning(
                    "worker %s runs %d requests here, over its %d slots: the leader's configuration "
                    "gives it more (`laneway cluster status` names what differs)",
                    self.name,
                    len(self._runs) + 1,
                    self.slots,
                )
        self._runs[run.job.id] = run
        run.task = asyncio.get_running_loop().create_task(self._go(run))

    def _stop(self, job_id: str) -> Run | None:
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

    def _live(self, run: Run, task: asyncio.Task[None] | None) -> bool:
        """Whether ``task`` is still ``run``'s current start: a run stopped (preempted,
        cancelled) while its task was between two steps must not go on, even if the task's
        cancel was lost; and a run resumed since has a task of its own."""
        return task is not None and run.task is task and self._runs.get(run.job.id) is run

    async def _go(self, run: Run) -> None:
        me = asyncio.current_task()
        try:
            if self.gate is not None:
                await self.gate(run.job.model)
            if run.job.kind == EMBEDDING:
                await self._embed(run)
            elif run.job.kind == RESPONSES:
                await self._relay(run)
            elif run.job.kind == RELAY:
                await self._pass(run)
            else:
                await self._generate(run)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self._live(run, me):  # (a run stopped meanwhile has had its end)
                self._end(run, Failed(run.job.id, self._failure(run, exc)))

    def _failure(self, run: Run, exc: Exception) -> Exception:
        """What a run that raised ``exc`` fails with (and where it may go on from)."""
        if isinstance(exc, RequestError):
            return exc
        if isinstance(exc, EngineError):  # (its own error, in its stream: a 400's is the client's)
            return engine_error(exc, self.name)
        if isinstance(exc, HttpError):  # the upstream died or stalled: the run may go on elsewhere
            # (an answer too large to read, or broken off, is one that is no answer: the worker
            # stays in placement, the run is tried again, then a 502; a kept-alive connection
            # the upstream closed as the request went says nothing of the worker)
            err = UpstreamUnavailable(
                f"upstream {self.name}: {exc}",
                malformed=isinstance(exc, (TooLarge, Cut)),
                worker_fault=not isinstance(exc, Stale),
            )
            err.unsent = isinstance(exc, (Unreached, Stale))
            err.cut = isinstance(exc, Cut)
            err.checkpoint = self._resumable(run)
            return err
        if isinstance(exc, UpstreamUnavailable):
            if exc.worker_fault:
                exc.checkpoint = self._resumable(run)
            return exc
        if isinstance(exc, BackendError):
            return exc
        # a bug of ours on what the upstream sent: the request fails, the worker goes on
        log.error("upstream %s: job %s failed on its answer", self.name, run.job.id, exc_info=exc)
        return UpstreamUnavailable(
            f"upstream {self.name} sent an answer that could not be read ({type(exc).__name__})",
            worker_fault=False,
        )

    def _resumable(self, run: Run) -> Checkpoint | None:
        """Where a run that failed part-way stopped, for another worker to go on from (as a
        preempted one would); ``None`` when it streamed nothing or may only restart."""
        exact = self.resume_method(run.job) not in (ResumeMethod.RESTART, ResumeMethod.NONE)
        if run.tokens + run.run_tokens == 0 or run.held or not exact or run.all_made:
            return None  # (all made: a run that went on would make more than asked)
        run.stopped()
        ids = run.out_ids is not None and run.prompt_ids is not None
        how = ResumeMethod.TOKEN_IDS if ids else ResumeMethod.TEXT
        return Checkpoint(run.job, how, run.tokens, run.text, 0, 0.0, _State(run))

    async def _embed(self, run: Run) -> None:
        me = asyncio.current_task()
        path, body = self.bodies.of(run)
        raw = json.dumps(body, separators=(",", ":")).encode()
        got = await self._fetch(run, path, raw)
        if not self._live(run, me):
            return
        ctype = got.headers.get(b"content-type", b"")
        if got.status != 200:
            raise error_from(got.status, got.body, self.name, ctype, path)
        try:
            answer = json.loads(got.body)
            if not isinstance(answer, dict):
                raise TypeError
        except (ValueError, TypeError):
            raise UpstreamUnavailable(
                f"upstream {self.name} answered an embedding that is not a JSON object: "
                + describe_body(got.body, ctype)
            ) from None
        usage = answer.get("usage")
        counted = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        prompt = counted if plausible(counted, 0, self.max_model_len or MAX_TOKENS) else 0
        self._end(run, Done(run.job.id, "stop", Usage(prompt, 0), "", response=answer))

    async def _generate(self, run: Run) -> None:
        me = asyncio.current_task()
        path, body = self.bodies.of(run)
        if run.continued and run.via == COMPLETION and (run.job.body or {}).get("stop"):
            assert run.prompt_ids is not None and run.out_ids is not None
            held = await self.probe.held_text(run.prompt_ids, run.out_ids, run.text)
            if not self._live(run, me):
                return
            if held is None and run.assembly is not None:
                # what the upstream held back cannot be read: the client has seen nothing
                # yet, so the request starts again from scratch (exact, at a cost)
                run.reset()
                path, body = self.bodies.of(run)
            else:
                run.catch_up(held or "")
        run.begin()
        done_seen = False

        def on_event(data: bytes) -> None:
            nonlocal done_seen
            if not self._live(run, me):  # (a stopped run's last bytes, read in the same turn)
                return
            if data == b"[DONE]":
                done_seen = True
                return
            if done_seen:
                return
            try:
                chunk = json_fast.loads(data)
            except ValueError:
                raise UpstreamUnavailable(f"upstream {self.name} sent a chunk that is not JSON") from None
            run.take(chunk)

        reader = await self._stream(run, me, path, body, on_event)
        if reader is None:
            return
        if reader.status != 200 and self.bodies.refused(run, reader.status):
            run.runs = max(run.runs - 1, 0)  # (that one did not run)
            await self._generate(run)  # once more, without what was refused
            return
        failure = stream_failure(reader, self.name, path=path)
        if failure is not None:
            raise failure
        if not done_seen and run.open > 0:
            raise UpstreamUnavailable(
                f"upstream {self.name}: its stream ended before its answer did "
                f"({reader.events} events, no finish_reason, no [DONE])"
            )
        self.bodies.learnt(run)
        self._end(run, run.ended())

    async def _stream(
        self,
        run: Run,
        me: asyncio.Task[None] | None,
        path: str,
        body: dict[str, Any],
        on_event: Callable[[bytes], None],
    ) -> Events | None:
        """Send ``body`` to ``path`` and read the event stream it answers into ``on_event``,
        within the worker's timeouts; ``None`` when the run was stopped meanwhile."""
        reader = Events(on_event)
        exchange = await self._pool.request(
            "POST",
            path,
            json_fast.dumps(body),
            reader,
            stall_s=self.stall_timeout_s,
            accept=b"text/event-stream",
            traceparent=self._traced(run),
            headers=run.job.headers,
        )
        if not self._live(run, me):  # stopped while the request was being sent: take it back
            exchange.abort()
            return None
        run.exchange = exchange
        timer = None
        if math.isfinite(self.timeout_s):
            timer = asyncio.get_running_loop().call_later(self.timeout_s, exchange.fail, self._late())
        try:
            await exchange.done
        finally:
            if timer is not None:
                timer.cancel()
            if run.exchange is exchange:
                run.exchange = None
        return reader if self._live(run, me) else None

    async def _fetch(self, run: Run, path: str, body: bytes) -> Collect:
        """A run's whole non-streamed exchange, within the worker's ``timeout_s``."""
        try:
            return await self._pool.fetch(
                "POST",
                path,
                body,
                timeout_s=self.timeout_s,
                traceparent=self._traced(run),
                headers=run.job.headers,
            )
        except Timeout:
            raise self._late() from None

    def _late(self) -> UpstreamTimeout:
        """What a run that took longer than ``timeout_s`` ends with: the request fails (504),
        not tried elsewhere, and the worker stays in placement (it was slow, not gone)."""
        return UpstreamTimeout(f"upstream {self.name}: no complete answer within {self.timeout_s:g} s")

    def _traced(self, run: Run) -> str | None:
        return self.trace(run.job.id) if self.trace is not None else None

    async def _relay(self, run: Run) -> None:
        """A request sent to the upstream's own endpoint as the client sent it (the Responses
        API: :mod:`laneway.backends.upstream_relay`), streamed, its events passed on."""
        me = asyncio.current_task()
        job = run.job
        body = self.bodies.relayed(job)
        run.begin()
        relayed = Relayed(run, self.name)

        def on_event(data: bytes) -> None:
            if self._live(run, me):
                relayed.take(data)

        reader = await self._stream(run, me, PATHS[job.kind], body, on_event)
        if reader is None:
            return
        failure = stream_failure(reader, self.name, path=PATHS[job.kind])
        if failure is not None:
            raise failure
        self._end(run, relayed.ended())

    async def _pass(self, run: Run) -> None:
        """A request to any other endpoint of the upstream, as the client sent it (but for the
        upstream's name of the model), streamed or not as the client asked; its answer kept as
        sent (:mod:`laneway.backends.upstream_relay`)."""
        me = asyncio.current_task()
        job = run.job
        body: dict[str, Any] = {**(job.body or {})}
        body["model"] = self.bodies.model_of(job)
        run.begin()
        if not job.stream:
            got = await self._fetch(run, job.endpoint, json_fast.dumps(body))
            if not self._live(run, me):
                return
            ctype = got.headers.get(b"content-type", b"").decode("latin-1")
            if got.status != 200:
                raise relay_error(got.status, got.body, self.name, job.endpoint, ctype.encode("latin-1"))
            self._end(run, whole(run, got.body, ctype or "application/octet-stream"))
            return
        passed = Passed(run, self.name)

        def on_event(data: bytes) -> None:
            if self._live(run, me):
                passed.take(data)

        reader = await self._stream(run, me, job.endpoint, body, on_event)
        if reader is None:
            return
        failure = stream_failure(reader, self.name, job.endpoint)
        if failure is not None:
            raise failure
        self._end(run, passed.ended())

    def _end(self, run: Run, event: Done | Failed) -> None:
        if self._runs.get(run.job.id) is run and (run.task is None or run.task is asyncio.current_task()):
            del self._runs[run.job.id]
            run.task = None
            run.sink(event)
