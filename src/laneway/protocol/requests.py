"""Reading an OpenAI request body: the job, its options, and what to forward.

:func:`parse_request` takes a ``/v1/chat/completions``, ``/v1/completions``
or ``/v1/embeddings`` body and what serves its model (:class:`Support`):

- for a model served by upstream workers, laneway reads only what it needs
  (the model, the size, the stream options, what decides how a preemption
  can resume) and forwards everything else as sent (``Job.body``); nothing is
  invented for fields the client left out;
- for the built-in engines, every field must be one the engine implements
  (:mod:`laneway.protocol.fields`), else the request is refused with a 400
  naming the field.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from laneway.config.schema import ServerConfig
from laneway.errors import InvalidRequest, ModelNotFound
from laneway.generation import (
    CHAT,
    COMPLETION,
    EMBEDDING,
    Job,
    ResumeRule,
    SamplingParams,
)
from laneway.protocol.builtin import check_fields, engine_job
from laneway.protocol.fields import OWNED, STRUCTURED
from laneway.protocol.values import flag, identifiers, max_tokens, message_list, stream_options

ID_PREFIX = {CHAT: "chatcmpl-", COMPLETION: "cmpl-", EMBEDDING: "embd-"}
LANEWAY_KEYS = frozenset({"priority", "preemptible"})


@dataclass(frozen=True)
class Support:
    """What serves a model: ``passthrough`` when every worker for it is an
    upstream (requests are forwarded); else the optional ``features`` its
    engines implement and their name for error messages."""

    passthrough: bool
    features: frozenset[str] = frozenset()
    engine: str = "the built-in engine"
    kinds: frozenset[str] = frozenset({CHAT, COMPLETION})


@dataclass(frozen=True)
class Parsed:
    job: Job
    stream: bool
    include_usage: bool
    preemptible: bool


def model_of(
    body: Mapping[str, Any], support: Mapping[str, Support], aliases: Mapping[str, str]
) -> tuple[str, Support]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model is required (a string)", param="model")
    model = aliases.get(model, model)
    found = support.get(model)
    if found is None:
        served = ", ".join(support)
        raise ModelNotFound(f"the model {model!r} does not exist; served: {served}", param="model")
    return model, found


def _extension(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``laneway`` object of a request (``priority``, ``preemptible``)."""
    ext = body.get("laneway")
    if ext is None:
        return {}
    if not isinstance(ext, dict) or not set(ext) <= LANEWAY_KEYS:
        raise InvalidRequest(
            f"laneway must be an object with keys among {', '.join(sorted(LANEWAY_KEYS))}", param="laneway"
        )
    return ext


def preemptibleflag(body: Mapping[str, Any]) -> bool:
    ext = _extension(body)
    if "preemptible" in ext:
        nested = flag(ext, "preemptible", True, within="laneway")
        if "preemptible" in body and flag(body, "preemptible", True) != nested:
            raise InvalidRequest(
                "preemptible and laneway.preemptible differ: send one", param="laneway.preemptible"
            )
        return nested
    return flag(body, "preemptible", True)


# ------------------------------------------------------------------ upstream workers
def _prompt_count(prompt: object) -> int:
    """How many prompts a completions ``prompt`` holds (a string, token ids, or lists of either)."""
    if isinstance(prompt, str):
        return 1
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return 1
        if all(isinstance(p, str | list) for p in prompt):
            return len(prompt)
    raise InvalidRequest(
        "prompt must be a string, a list of strings, a list of token ids or a list of such lists",
        param="prompt",
    )


def resume_rule(
    body: Mapping[str, Any], kind: str, params: SamplingParams, stream: bool, prompts: int
) -> ResumeRule:
    """How a preemption may treat a forwarded request.

    Exactly resumable (from the token ids so far) unless its state cannot be
    carried over: several choices or prompts, seeded sampling (the engine
    would restart its random stream), tools or structured output (the
    parser's state), presence/frequency penalties (counted over the output
    only, which a resumed request holds in its prompt), beam search. Such a
    request restarts from scratch if nothing of it was shown yet (a client
    that does not stream), else it is not preempted once started.
    """
    if kind == EMBEDDING:
        return ResumeRule.NONE
    tools = body.get("tools") or body.get("functions")
    choice = body.get("tool_choice") or body.get("function_call")
    fmt = body.get("response_format")
    inexact = (
        params.n > 1
        or prompts > 1
        or (body.get("seed") is not None and not params.greedy)
        or bool(tools and choice != "none")
        or (isinstance(fmt, dict) and fmt.get("type") not in (None, "text"))
        or any(body.get(k) is not None for k in STRUCTURED)
        or any(body.get(k) not in (None, 0, 0.0) for k in ("presence_penalty", "frequency_penalty"))
        or body.get("best_of") not in (None, 1)
        or bool(body.get("echo"))  # its prompt is part of the answer, which token ids do not say
        or bool(body.get("use_beam_search"))
    )
    if not inexact:
        return ResumeRule.EXACT
    return ResumeRule.NONE if stream else ResumeRule.RESTART


def _lenient(body: Mapping[str, Any], name: str, default: float) -> float:
    """A number laneway only looks at (the upstream validates it): the default where it is not one."""
    value = body.get(name)
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1e6:
        return float(value)
    return default


def _forwarded_params(body: Mapping[str, Any], kind: str) -> SamplingParams:
    n = body.get("n")
    return SamplingParams(
        max_tokens=max_tokens(body, kind) if kind != EMBEDDING else None,
        temperature=min(_lenient(body, "temperature", 1.0), 2.0),
        ignore_eos=body.get("ignore_eos") is True,
        n=n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1,
    )


def _forwarded_job(rid: str, model: str, body: Mapping[str, Any], kind: str) -> Job:
    stream, _ = stream_options(body)
    params = _forwarded_params(body, kind)
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise InvalidRequest(f"n must be a whole number ≥ 1, got {n!r}", param="n")
    forwarded = {k: v for k, v in body.items() if k not in OWNED}
    if (
        kind == CHAT
        and "max_completion_tokens" in forwarded
        and forwarded["max_completion_tokens"] is not None
    ):
        # (the limit is max_completion_tokens: an upstream that reads max_tokens first gets no other)
        forwarded.pop("max_tokens", None)
    prompts = 1
    messages = None
    prompt = None
    if kind == CHAT:
        messages = tuple(message_list(body.get("messages")))
    elif kind == COMPLETION:
        prompt = body.get("prompt")
        prompts = _prompt_count(prompt)
    else:
        if body.get("input") is None:
            raise InvalidRequest("input is required", param="input")
        if stream:
            raise InvalidRequest("embeddings cannot be streamed", param="stream")
    rule = resume_rule(body, kind, params, stream, prompts)
    return Job(
        rid,
        model,
        params,
        prompt=prompt,
        messages=messages,
        kind=kind,
        body=forwarded,
        stream=stream,
        resume=rule,
    )


# ------------------------------------------------------------------ entry point
def parse_request(
    body: Mapping[str, Any], kind: str, config: ServerConfig, support: Mapping[str, Support]
) -> Parsed:
    """The job and options of a ``kind`` request (``chat``, ``completion``, ``embedding``)."""
    model, served = model_of(body, support, config.aliases)
    if kind not in served.kinds:
        raise InvalidRequest(f"model {model!r} does not serve {kind} requests", param="model")
    stream, include_usage = stream_options(body)
    preemptible = preemptibleflag(body)
    identifiers(body)
    best_of, n = body.get("best_of"), body.get("n")
    if type(best_of) is int and type(n) is int and best_of < n:
        raise InvalidRequest(f"best_of ({best_of}) must be at least n ({n})", param="best_of")
    rid = ID_PREFIX[kind] + os.urandom(12).hex()
    if served.passthrough:
        job = _forwarded_job(rid, model, body, kind)
    else:
        job = engine_job(rid, model, body, kind, config, served)
        check_fields(body, kind, model, served)
    return Parsed(job, stream, include_usage, preemptible and job.resume != ResumeRule.NONE)
