"""Reading a request: the JSON body (size-limited), the key, the priority, the job."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from laneway.config.schema import ServerConfig, TenantConfig
from laneway.errors import InvalidRequest, ModelNotFound, PayloadTooLarge, Unauthorized
from laneway.generation import Job, SamplingParams

PRIORITY_HEADER = "x-laneway-priority"


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object; 413 past ``limit`` bytes, 400 if it is not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the request body is {declared} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    return body


def authenticate(request: Request, config: ServerConfig) -> TenantConfig | None:
    """The tenant the bearer key belongs to (``None`` when keys are not required)."""
    if not config.auth:
        return None
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    tenant = config.tenant_for_key(key.strip())
    if tenant is None:
        raise Unauthorized("invalid API key")
    return tenant


def parse_class(value: object, config: ServerConfig, param: str) -> int:
    try:
        return config.scheduler.classes.parse(value)
    except ValueError as exc:
        raise InvalidRequest(str(exc), param=param) from None


def priority(
    body: Mapping[str, Any], headers: Mapping[str, str], tenant: TenantConfig | None, config: ServerConfig
) -> int:
    """Body ``priority``, else the ``X-Laneway-Priority`` header, else ``service_tier``,
    else the tenant's default class, else the server's."""
    if body.get("priority") is not None:
        return parse_class(body["priority"], config, "priority")
    header = headers.get(PRIORITY_HEADER)
    if header:
        return parse_class(header, config, "X-Laneway-Priority")
    tier = body.get("service_tier")
    if tier is not None:
        if not isinstance(tier, str) or tier not in config.service_tiers:
            known = ", ".join(config.service_tiers)
            raise InvalidRequest(
                f"unknown service_tier {tier!r}: expected one of {known}", param="service_tier"
            )
        name = config.service_tiers[tier]
        if name is not None:
            return parse_class(name, config, "service_tier")
    if tenant is not None and tenant.policy.default_class is not None:
        return tenant.policy.default_class
    return config.default_priority


@dataclass(frozen=True)
class Parsed:
    job: Job
    stream: bool
    include_usage: bool
    preemptible: bool


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


def _model(body: Mapping[str, Any], models: tuple[str, ...], aliases: Mapping[str, str]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model is required (a string)", param="model")
    model = aliases.get(model, model)
    if model not in models:
        raise ModelNotFound(f"the model {model!r} does not exist; served: {', '.join(models)}", param="model")
    return model


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


ROLES = ("system", "developer", "user", "assistant")


def _messages(value: object) -> list[dict[str, Any]]:
    """Chat messages: each a role and text content (a string or ``text`` parts)."""
    if not isinstance(value, list) or not value:
        raise InvalidRequest("messages must be a non-empty list of message objects", param="messages")
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise InvalidRequest(f"{where} must be an object with a role and content", param=where)
        role = m.get("role")
        if role not in ROLES:
            raise InvalidRequest(
                f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", param=f"{where}.role"
            )
        content = m.get("content")
        if isinstance(content, str):
            continue
        if not (isinstance(content, list) and all(map(_text_part, content))):
            raise InvalidRequest(
                f"{where}.content must be a string or a list of text parts "
                '({"type": "text", "text": "..."}); other content is not supported',
                param=f"{where}.content",
            )
    return value


def _text_part(part: object) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)


def _unsupported(body: Mapping[str, Any], chat: bool) -> None:
    """Refuse what the engines cannot do rather than ignore it silently."""
    for name in ("tools", "functions"):
        if body.get(name):
            raise InvalidRequest(f"{name} (function calling) is not supported", param=name)
    logprobs = body.get("logprobs")
    if logprobs not in (None, False, 0) or body.get("top_logprobs"):
        raise InvalidRequest("logprobs are not supported", param="logprobs")
    if not chat:
        if body.get("echo"):
            raise InvalidRequest("echo is not supported", param="echo")
        if body.get("suffix"):
            raise InvalidRequest("suffix is not supported", param="suffix")
        if body.get("best_of") not in (None, 1):
            raise InvalidRequest("only best_of=1 is supported", param="best_of")


def parse_job(body: Mapping[str, Any], chat: bool, config: ServerConfig, models: tuple[str, ...]) -> Parsed:
    """The job and options of a ``/v1/chat/completions`` (``chat``) or ``/v1/completions`` body."""
    model = _model(body, models, config.aliases)
    if body.get("n") not in (None, 1):
        raise InvalidRequest("only n=1 is supported", param="n")
    _unsupported(body, chat)
    max_tokens = body.get("max_completion_tokens") if chat else None
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    temperature = body.get("temperature")
    top_p = body.get("top_p")
    params = SamplingParams(
        max_tokens=config.default_max_tokens if max_tokens is None else max_tokens,
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        seed=body.get("seed"),
        stop=_stop(body.get("stop")),
        ignore_eos=_flag(body, "ignore_eos", False),
    )
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    if chat:
        messages = _messages(body.get("messages"))
        job = Job(
            rid, model, params, messages=tuple(messages), continue_final=_continue_final(body, messages)
        )
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise InvalidRequest("prompt must be a string (one prompt per request)", param="prompt")
        job = Job(rid, model, params, prompt=prompt)
    stream = _flag(body, "stream", False)
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise InvalidRequest("stream_options must be an object", param="stream_options")
        include_usage = _flag(options, "include_usage", False)
    return Parsed(job, stream, include_usage, _flag(body, "preemptible", True))
