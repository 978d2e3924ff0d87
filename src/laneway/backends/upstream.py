"""An OpenAI-compatible server (vLLM, SGLang, llama.cpp, TGI, another laneway) as a worker.

Each upstream worker has a slot limit, so requests queue in laneway rather
than inside the engine. A job is one streamed ``/completions`` or
``/chat/completions`` call. Preempting it aborts the stream (closing the
connection makes vLLM and the others abort the sequence); resuming sends the
prompt plus the text so far and asks for the tokens still owed
(``recompute``): for completions the text is appended to the prompt, for chat
it becomes a final assistant message with ``continue_final_message: true`` and
``add_generation_prompt: false`` (as vLLM and laneway take it). Greedy text
comes out the same when the upstream tokenizes prompt + text as it generated
it (true of byte-level tokenizers; usually, not always, of BPE ones).

Errors map to the client's: an upstream 400/404/413 is that error with the
upstream's message; connection failures, timeouts, 429 and 5xx are
:class:`UpstreamUnavailable` (retryable: the runtime may run the request on
another worker when nothing was streamed yet).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from laneway.backends.base import Capacity, Health, Sink
from laneway.errors import BackendError, InvalidRequest, ModelNotFound, PayloadTooLarge, RequestError
from laneway.generation import Checkpoint, Delta, Done, Failed, Job, Stopped, Usage


class UpstreamUnavailable(BackendError):
    """The upstream could not be reached or answered 429/5xx; another worker may do."""

    retryable = True


@dataclass(eq=False)
class _Run:
    job: Job
    sink: Sink
    text: str = ""  # the whole completion so far, over every run
    tokens: int = 0  # completion tokens so far, over every run
    prompt_tokens: int | None = None  # of the original prompt, once the upstream said
    prefix_tokens: int = 0  # tokens generated before this run (a resumed job)
    task: asyncio.Task[None] | None = field(default=None, repr=False)


@dataclass
class _State:
    """An upstream job's checkpoint: only the text; resuming recomputes."""

    text: str
    tokens: int
    prompt_tokens: int | None


class UpstreamWorker:
    def __init__(
        self,
        name: str,
        url: str | None,
        model: str,
        *,
        slots: int = 4,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        options: dict[str, Any] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not url:
            raise InvalidRequest(f"worker {name}: an upstream needs a url")
        self.name = name
        self.model = model
        self.slots = slots
        self.base = url.rstrip("/")
        self.options = dict(options or {})  # extra body fields sent with every request
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
            limits=httpx.Limits(max_connections=slots + 4, max_keepalive_connections=slots),
            transport=transport,
        )
        self._runs: dict[str, _Run] = {}

    def capacity(self) -> Capacity:
        return Capacity(self.slots, len(self._runs), (self.model,))

    # ------------------------------------------------------------ protocol
    async def run(self, job: Job, sink: Sink) -> None:
        self._start(_Run(job, sink))

    async def resume(self, checkpoint: Checkpoint, sink: Sink) -> None:
        state = checkpoint.state
        if not isinstance(state, _State):
            raise BackendError(f"checkpoint of {checkpoint.job.id} was not made by an upstream worker")
        run = _Run(checkpoint.job, sink, state.text, state.tokens, state.prompt_tokens, state.tokens)
        self._start(run)

    async def preempt(self, job_id: str, mode: str) -> None:
        run = await self._stop(job_id)
        if run is None:
            return
        state = _State(run.text, run.tokens, run.prompt_tokens)
        ckpt = Checkpoint(run.job, "recompute", run.tokens, run.text, 0, 0.0, state)
        run.sink(Stopped(run.job.id, ckpt))

    async def cancel(self, job_id: str) -> None:
        run = await self._stop(job_id)
        if run is not None:
            run.sink(Done(job_id, "cancelled", self._usage(run, None), run.text))

    def discard(self, checkpoint: Checkpoint) -> None:
        """Nothing is held: the checkpoint is its text."""

    async def health(self) -> Health:
        try:
            resp = await self._client.get(f"{self.base}/models", timeout=5.0)
        except httpx.HTTPError as exc:
            return Health(False, f"{self.base}: {type(exc).__name__}: {exc}")
        if resp.status_code != 200:
            return Health(False, f"{self.base}/models answered {resp.status_code}")
        return Health(True, f"{self.base}: {len(self._runs)}/{self.slots} slots busy")

    async def close(self) -> None:
        for job_id in list(self._runs):
            await self._stop(job_id)
        await self._client.aclose()

    # ------------------------------------------------------------ internals
    def _start(self, run: _Run) -> None:
        if run.job.id in self._runs:
            raise InvalidRequest(f"job {run.job.id!r} is already running on worker {self.name}")
        if len(self._runs) >= self.slots:
            raise BackendError(f"all {self.slots} slots of worker {self.name} are busy")
        self._runs[run.job.id] = run
        run.task = asyncio.get_running_loop().create_task(self._stream(run))

    async def _stop(self, job_id: str) -> _Run | None:
        run = self._runs.pop(job_id, None)
        if run is None or run.task is None:
            return run
        run.task.cancel()  # closes the connection: the upstream aborts the sequence
        with contextlib.suppress(asyncio.CancelledError):
            await run.task
        return run

    def _body(self, run: _Run) -> tuple[str, dict[str, Any]]:
        job, p = run.job, run.job.params
        body: dict[str, Any] = {
            **self.options,
            "model": self.model,
            "max_tokens": max(p.max_tokens - run.tokens, 1),
            "temperature": p.temperature,
            "top_p": p.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if p.seed is not None:
            body["seed"] = p.seed
        if p.stop:
            body["stop"] = list(p.stop)
        if p.ignore_eos:
            body["ignore_eos"] = True
        if job.prompt is not None:
            body["prompt"] = job.prompt + run.text
            return "completions", body
        messages = [dict(m) for m in job.messages or ()]
        if run.text:
            messages.append({"role": "assistant", "content": run.text})
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        body["messages"] = messages
        return "chat/completions", body

    async def _stream(self, run: _Run) -> None:
        path, body = self._body(run)
        finish: str | None = None
        usage: dict[str, Any] | None = None
        try:
            async with self._client.stream("POST", f"{self.base}/{path}", json=body) as resp:
                if resp.status_code != 200:
                    raise await _error_from(resp, self.name)
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise BackendError(
                            f"upstream {self.name}: {chunk['error'].get('message', chunk['error'])}"
                        )
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or ():
                        text = (
                            choice.get("text")
                            if "text" in choice
                            else (choice.get("delta") or {}).get("content")
                        )
                        if text:
                            run.text += text
                            run.tokens += 1
                            run.sink(Delta(run.job.id, text, run.tokens))
                        finish = choice.get("finish_reason") or finish
        except asyncio.CancelledError:
            raise
        except (RequestError, BackendError) as exc:
            self._end(run, Failed(run.job.id, exc))
            return
        except httpx.TimeoutException as exc:
            self._end(run, Failed(run.job.id, UpstreamUnavailable(f"upstream {self.name} timed out: {exc}")))
            return
        except (httpx.HTTPError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            err = UpstreamUnavailable(f"upstream {self.name} failed: {type(exc).__name__}: {exc}")
            self._end(run, Failed(run.job.id, err))
            return
        if usage is not None and usage.get("completion_tokens") is not None:
            run.tokens = run.prefix_tokens + int(usage["completion_tokens"])
        self._end(run, Done(run.job.id, finish or "stop", self._usage(run, usage), run.text))

    def _usage(self, run: _Run, usage: dict[str, Any] | None) -> Usage:
        if run.prompt_tokens is None and usage is not None and usage.get("prompt_tokens") is not None:
            # a resumed run's prompt held the text so far too
            run.prompt_tokens = max(int(usage["prompt_tokens"]) - run.prefix_tokens, 0)
        return Usage(run.prompt_tokens or 0, run.tokens)

    def _end(self, run: _Run, event: Done | Failed) -> None:
        if self._runs.get(run.job.id) is run:
            del self._runs[run.job.id]
            run.sink(event)


def _choice_text(choice: dict[str, Any]) -> str | None:
    """A chunk's new text: ``text`` (completions) or ``delta.content`` (chat)."""
    if "text" in choice:
        return choice["text"]
    return (choice.get("delta") or {}).get("content")


def _message(err: Any) -> str:
    return str(err.get("message") or err) if isinstance(err, dict) else str(err)


async def _error_from(resp: httpx.Response, name: str) -> Exception:
    """The client-facing error for an upstream's error answer."""
    raw = await resp.aread()
    try:
        message = _message(json.loads(raw)["error"])
    except (ValueError, KeyError, TypeError):
        message = raw.decode("utf-8", "replace")[:300] or resp.reason_phrase
    text = f"upstream {name}: {message}"
    status = resp.status_code
    if status == 404:
        return ModelNotFound(text)
    if status == 413:
        return PayloadTooLarge(text)
    if 400 <= status < 500 and status not in (401, 403, 408, 429):
        return InvalidRequest(text)
    return UpstreamUnavailable(f"{text} (HTTP {status})")
