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

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from laneway.config.schema import ServerConfig
from laneway.errors import InvalidRequest, ModelNotFound
from laneway.generation import (
    CHAT,
    COMPLETION,
    EMBEDDING,
    MAX_CHOICES,
    RESUME_EXACT,
    RESUME_NONE,
    RESUME_RESTART,
    Job,
    SamplingParams,
)
from laneway.protocol.fields import FEATURES, OWNED, READ, STRUCTURED, neutral

ROLES = ("system", "developer", "user", "assistant")
MAX_TOKENS_LIMIT = 1 << 31  # a max_tokens beyond any context window is a mistake, not a wish
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


def _flag(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be true or false, got {value!r}", param=name)
    return value


def _stop(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise InvalidRequest("stop must be a string or a list of strings", param="stop")


def _max_tokens(body: Mapping[str, Any], kind: str) -> int | None:
    name = "max_completion_tokens" if kind == CHAT and body.get("max_completion_tokens") is not None else None
    value = body.get(name) if name else body.get("max_tokens")
    name = name or "max_tokens"
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < MAX_TOKENS_LIMIT:
        raise InvalidRequest(f"{name} must be a whole number ≥ 1, got {value!r}", param=name)
    return value


def _stream_options(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = _flag(body, "stream", False)
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise InvalidRequest("stream_options must be an object", param="stream_options")
        include_usage = _flag(options, "include_usage", False)
    return stream, include_usage


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


def preemptible_flag(body: Mapping[str, Any]) -> bool:
    ext = _extension(body)
    if "preemptible" in ext:
        return _flag(ext, "preemptible", True)
    return _flag(body, "preemptible", True)


# ------------------------------------------------------------------ the built-in engines
def _check_fields(body: Mapping[str, Any], kind: str, model: str, support: Support) -> None:
    """Refuse any field the engine does not implement, unless it asks for nothing."""
    read = READ[kind]
    for name, value in body.items():
        if name in read or name in OWNED:
            continue
        feature = FEATURES.get(name)
        if feature is not None and feature in support.features:
            continue
        if neutral(name, value):
            continue
        raise InvalidRequest(
            f"{name} is not supported by {support.engine} serving {model!r} "
            "(upstream workers forward it to the engine they front)",
            param=name,
        )


def _text_part(part: object) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)


def _engine_messages(value: object) -> list[dict[str, Any]]:
    """Chat messages: each a role and text content (a string or ``text`` parts)."""
    messages = _message_list(value)
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if m.get("role") not in ROLES:
            raise InvalidRequest(
                f"{where}.role must be one of {', '.join(ROLES)}, got {m.get('role')!r}",
                param=f"{where}.role",
            )
        content = m.get("content")
        if isinstance(content, str):
            continue
        if not (isinstance(content, list) and all(map(_text_part, content))):
            raise InvalidRequest(
                f"{where}.content must be a string or a list of text parts "
                '({"type": "text", "text": "..."}); other content is not supported by this engine',
                param=f"{where}.content",
            )
    return messages


def _message_list(value: object) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise InvalidRequest("messages must be a non-empty list of message objects", param="messages")
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise InvalidRequest(
                f"messages[{i}] must be an object with a role and content", param=f"messages[{i}]"
            )
        if not isinstance(m.get("role"), str):
            raise InvalidRequest(f"messages[{i}].role must be a string", param=f"messages[{i}].role")
    return value


def _continue_final(body: Mapping[str, Any], messages: list[dict[str, Any]]) -> bool:
    """``continue_final_message``: continue the last (assistant) message instead of a new turn.

    The chat template then adds no generation prompt, so ``add_generation_prompt``
    must be false with it (and may only be false with it).
    """
    cont = _flag(body, "continue_final_message", False)
    add = _flag(body, "add_generation_prompt", not cont)
    if cont and add:
        raise InvalidRequest(
            "continue_final_message and add_generation_prompt cannot both be true",
            param="add_generation_prompt",
        )
    if not cont and not add:
        raise InvalidRequest(
            "add_generation_prompt=false is supported only with continue_final_message=true",
            param="add_generation_prompt",
        )
    if cont and messages[-1].get("role") != "assistant":
        raise InvalidRequest(
            "continue_final_message needs an assistant message last", param="continue_final_message"
        )
    return cont


def _logprobs(body: Mapping[str, Any], kind: str) -> int | None:
    """Chat: ``logprobs`` (bool) and ``top_logprobs`` (0–20); completions: ``logprobs`` (0–5)."""
    value = body.get("logprobs")
    if kind == COMPLETION:
        if value is None or value is False:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 5:
            raise InvalidRequest(f"logprobs must be a whole number in 0–5, got {value!r}", param="logprobs")
        return value
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest(f"logprobs must be true or false, got {value!r}", param="logprobs")
    top = body.get("top_logprobs")
    if top is not None and not value:
        if top == 0 and not isinstance(top, bool):
            return None
        raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    return (0 if top is None else top) if value else None


def _number(body: Mapping[str, Any], name: str, default: Any) -> Any:
    value = body.get(name)
    return default if value is None else value


def _logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InvalidRequest("logit_bias must be an object of token ids to biases", param="logit_bias")
    out = []
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise InvalidRequest(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias")
        out.append((int(key), bias))
    return tuple(out)


def _token_ids(value: object, name: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise InvalidRequest(f"{name} must be a list of token ids", param=name)
    return tuple(value)


def _engine_params(body: Mapping[str, Any], kind: str, config: ServerConfig) -> SamplingParams:
    max_tokens = _max_tokens(body, kind)
    n = _number(body, "n", 1)
    if isinstance(n, int) and n > MAX_CHOICES:
        raise InvalidRequest(f"n must be at most {MAX_CHOICES} on this engine, got {n}", param="n")
    return SamplingParams(
        max_tokens=config.default_max_tokens if max_tokens is None else max_tokens,
        temperature=_number(body, "temperature", 1.0),
        top_p=_number(body, "top_p", 1.0),
        seed=body.get("seed"),
        stop=_stop(body.get("stop")),
        ignore_eos=_flag(body, "ignore_eos", False),
        n=n,
        logprobs=_logprobs(body, kind),
        presence_penalty=_number(body, "presence_penalty", 0.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0),
        repetition_penalty=_number(body, "repetition_penalty", 1.0),
        top_k=_number(body, "top_k", 0),
        min_p=_number(body, "min_p", 0.0),
        min_tokens=_number(body, "min_tokens", 0),
        stop_token_ids=_token_ids(body.get("stop_token_ids"), "stop_token_ids"),
        logit_bias=_logit_bias(body.get("logit_bias")),
        return_token_ids=_flag(body, "return_token_ids", False),
    )


def _engine_job(
    rid: str, model: str, body: Mapping[str, Any], kind: str, config: ServerConfig, support: Support
) -> Job:
    stream = _flag(body, "stream", False)
    if kind == CHAT:
        messages = _engine_messages(body.get("messages"))
        cont = _continue_final(body, messages)
        params = _engine_params(body, kind, config)
        return Job(rid, model, params, messages=tuple(messages), continue_final=cont, stream=stream)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    ids = isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    if ids and "token_ids" in support.features:
        return Job(rid, model, _engine_params(body, kind, config), prompt=list(prompt), stream=stream)
    if not isinstance(prompt, str):
        raise InvalidRequest("prompt must be a string or token ids (one prompt per request)", param="prompt")
    return Job(rid, model, _engine_params(body, kind, config), prompt=prompt, stream=stream)


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
) -> str:
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
        return RESUME_NONE
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
        return RESUME_EXACT
    return RESUME_NONE if stream else RESUME_RESTART


def _lenient(body: Mapping[str, Any], name: str, default: float) -> float:
    """A number laneway only looks at (the upstream validates it): the default where it is not one."""
    value = body.get(name)
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1e6:
        return float(value)
    return default


def _forwarded_params(body: Mapping[str, Any], kind: str) -> SamplingParams:
    n = body.get("n")
    return SamplingParams(
        max_tokens=_max_tokens(body, kind) if kind != EMBEDDING else None,
        temperature=min(_lenient(body, "temperature", 1.0), 2.0),
        ignore_eos=body.get("ignore_eos") is True,
        n=n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1,
    )


def _forwarded_job(rid: str, model: str, body: Mapping[str, Any], kind: str) -> Job:
    stream, _ = _stream_options(body)
    params = _forwarded_params(body, kind)
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise InvalidRequest(f"n must be a whole number ≥ 1, got {n!r}", param="n")
    forwarded = {k: v for k, v in body.items() if k not in OWNED}
    prompts = 1
    messages = None
    prompt = None
    if kind == CHAT:
        messages = tuple(_message_list(body.get("messages")))
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
    stream, include_usage = _stream_options(body)
    preemptible = preemptible_flag(body)
    rid = ID_PREFIX[kind] + uuid.uuid4().hex[:24]
    if served.passthrough:
        job = _forwarded_job(rid, model, body, kind)
    else:
        job = _engine_job(rid, model, body, kind, config, served)
        _check_fields(body, kind, model, served)
    return Parsed(job, stream, include_usage, preemptible and job.resume != RESUME_NONE)
