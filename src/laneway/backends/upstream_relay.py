"""Requests relayed to an upstream's own endpoint as sent: its answer passed on.

:class:`Relayed`, the Responses API: the upstream streams events (``event: …`` /
``data: {"type": …}``); each goes to the client as it came (a client that streams),
its text counted as the run's progress. The event that ends it
(``response.completed``, ``response.incomplete``, ``response.failed``) is held
back: it goes with the job's ``Done``, which carries the finished response object,
so that laneway can put its own id and ``laneway`` object on it.

:class:`Passed`, any other endpoint (Anthropic's Messages API, rerank, score …): a
stream's events go to the client as they came, each counted; a whole answer is
kept as sent (:func:`whole`). Token counts come from what the answer says of its
usage, in OpenAI's words or Anthropic's.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from laneway.backends.upstream_run import (
    EngineError,
    Run,
    UpstreamUnavailable,
    message_of,
    overrun,
    plausible,
)
from laneway.errors import BackendError
from laneway.generation import Delta, Done, Usage
from laneway.protocol import json_fast

ENDINGS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class Relayed:
    """One run's events in; deltas out; its end kept."""

    def __init__(self, run: Run, source: str) -> None:
        self.run = run
        self.source = source
        self.last: dict[str, Any] | None = None  # the event that ended it

    def take(self, data: bytes) -> None:
        run = self.run
        if data == b"[DONE]" or self.last is not None:
            return
        try:
            event = json_fast.loads(data)
        except ValueError:
            raise UpstreamUnavailable(f"upstream {self.source} sent an event that is not JSON") from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise UpstreamUnavailable(f"upstream {self.source} sent an event with no type")
        kind = event["type"]
        if kind == "error":
            raise EngineError(self.source, event)
        if kind in ENDINGS:
            self.last = event
            return
        piece = event.get("delta") if kind == "response.output_text.delta" else None
        text = piece if isinstance(piece, str) else ""
        if text:
            run.text += text
            run.run_tokens += 1  # (a count of deltas until the upstream's usage says)
            if run.run_tokens > run.most_tokens:
                raise overrun(f"upstream {self.source} streamed more than the {run.most_tokens} tokens asked")
        counted = run.tokens + run.run_tokens
        if run.assembly is None:  # its client streams: every event, as sent
            run.sink(Delta(run.job.id, text, counted, chunk=event))
        elif text:
            run.sink(Delta(run.job.id, text, counted))

    def ended(self) -> Done:
        """The job's end, from the event that ended its stream."""
        last = self.last
        if last is None:
            raise UpstreamUnavailable(
                f"upstream {self.source}: its stream ended before its answer did (no response.completed)"
            )
        response = last.get("response")
        if not isinstance(response, dict):
            raise UpstreamUnavailable(f"upstream {self.source} ended its stream with no response object")
        if last["type"] == "response.failed":
            error = response.get("error")
            raise BackendError(
                f"upstream {self.source}: {message_of(error) if error else 'the response failed'}"
            )
        run = self.run
        usage = response.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        made, given = usage.get("output_tokens"), usage.get("input_tokens")
        if plausible(made, run.run_tokens, run.most_tokens):  # (its own count, where believable)
            run.run_tokens = made
        prompt = given if plausible(given, 0, 1 << 31) else 0
        finish = "length" if response.get("status") == "incomplete" else "stop"
        return Done(
            run.job.id,
            finish,
            Usage(prompt, run.tokens + run.run_tokens),
            run.text,
            response=response,
            chunks=(last,),
        )


def usage_in(obj: object) -> tuple[int | None, int | None]:
    """The (input, output) tokens an answer or event says it used, where it says: OpenAI's
    ``usage.prompt_tokens`` / ``completion_tokens``, Anthropic's ``usage.input_tokens`` /
    ``output_tokens`` (also inside its ``message_start`` event's ``message``)."""
    if not isinstance(obj, dict):
        return None, None
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        inner = obj.get("message")
        usage = inner.get("usage") if isinstance(inner, dict) else None
    if not isinstance(usage, dict):
        return None, None
    given = usage.get("prompt_tokens", usage.get("input_tokens"))
    made = usage.get("completion_tokens", usage.get("output_tokens"))
    return (given if plausible(given, 0, 1 << 31) else None, made if plausible(made, 0, 1 << 31) else None)


class Passed:
    """One relayed stream's events in (each a JSON object, or ``[DONE]``); deltas out."""

    def __init__(self, run: Run, source: str) -> None:
        self.run = run
        self.source = source
        self.done_line = False
        self.given: int | None = None
        self.made: int | None = None
        self.events = 0

    def take(self, data: bytes) -> None:
        run = self.run
        self.events += 1
        if data == b"[DONE]":
            self.done_line = True
            return
        if self.done_line:
            return
        try:
            event = json_fast.loads(data)
        except ValueError:
            raise UpstreamUnavailable(f"upstream {self.source} sent an event that is not JSON") from None
        if not isinstance(event, dict):
            raise UpstreamUnavailable(f"upstream {self.source} sent an event that is not an object")
        given, made = usage_in(event)
        self.given = given if given is not None else self.given
        self.made = made if made is not None else self.made
        run.run_tokens += 1  # (progress: events until the upstream's usage says)
        run.sink(Delta(run.job.id, "", run.tokens + run.run_tokens, chunk=event))

    def ended(self) -> Done:
        run = self.run
        if not self.events:  # (a 200 event stream of no event: bytes that are no events, or none)
            raise UpstreamUnavailable(f"upstream {self.source}: its stream ended with no event")
        if plausible(self.made, 0, run.most_tokens):
            run.run_tokens = self.made
        tail = (b"data: [DONE]\n\n" if self.done_line else b"", "")
        return Done(run.job.id, "stop", Usage(self.given or 0, run.tokens + run.run_tokens), "", raw=tail)


def whole(run: Run, body: bytes, content_type: str) -> Done:
    """A relayed job's whole answer, kept as the upstream sent it (its usage counted, if JSON)."""
    given = made = None
    if content_type.split(";")[0].strip().lower() == "application/json":
        with contextlib.suppress(ValueError):
            given, made = usage_in(json.loads(body))
    made = made if plausible(made, 0, run.most_tokens) else 0
    return Done(run.job.id, "stop", Usage(given or 0, made), "", raw=(body, content_type))
