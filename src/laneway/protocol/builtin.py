"""Requests for the built-in engines (the in-process engine, the simulated worker).

Every field must be one the engine implements (:mod:`laneway.protocol.fields`),
else the request is refused with a 400 naming the field; the values are read
into :class:`~laneway.generation.SamplingParams`, which checks their ranges.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from laneway.config.schema import ServerConfig
from laneway.errors import InvalidRequest
from laneway.generation import CHAT, COMPLETION, MAX_CHOICES, Job, SamplingParams
from laneway.protocol.fields import FEATURES, OWNED, READ, neutral
from laneway.protocol.values import flag, max_tokens, max_tokens_field, message_list, stop_strings

if TYPE_CHECKING:
    from laneway.protocol.requests import Support

ROLES = ("system", "developer", "user", "assistant")


def check_fields(body: Mapping[str, Any], kind: str, model: str, support: Support) -> None:
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
    messages = message_list(value)
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if m.get("role") not in ROLES:
            raise InvalidRequest(
                f"{where}.role must be one of {', '.join(ROLES)}, got {m.get('role')!r}",
                param=f"{where}.role",
            )
        if m.get("tool_calls"):  # (an assistant's tool call: tools are not served here)
            raise InvalidRequest(
                f"{where}.tool_calls: tool calls are not supported by this engine "
                "(upstream workers forward them to the engine they front)",
                param=f"{where}.tool_calls",
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


def _continue_final(body: Mapping[str, Any], messages: list[dict[str, Any]]) -> bool:
    """``continue_final_message``: continue the last (assistant) message instead of a new turn.

    The chat template then adds no generation prompt, so ``add_generation_prompt``
    must be false with it (and may only be false with it).
    """
    cont = flag(body, "continue_final_message", False)
    add = flag(body, "add_generation_prompt", not cont)
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
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 19):
            shown = key if len(key) <= 40 else key[:40] + "…"
            raise InvalidRequest(f"logit_bias keys must be token ids, got {shown!r}", param="logit_bias")
        out.append((int(key), bias))
    return tuple(out)


def _token_ids(value: object, name: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise InvalidRequest(f"{name} must be a list of token ids", param=name)
    return tuple(value)


def _engine_params(body: Mapping[str, Any], kind: str, config: ServerConfig) -> SamplingParams:
    limit = max_tokens(body, kind)
    n = _number(body, "n", 1)
    if isinstance(n, int) and n > MAX_CHOICES:
        raise InvalidRequest(f"n must be at most {MAX_CHOICES} on this engine, got {n}", param="n")
    return SamplingParams(
        max_tokens=config.default_max_tokens if limit is None else limit,
        max_tokens_from=None if limit is None else max_tokens_field(body, kind),
        temperature=_number(body, "temperature", 1.0),
        top_p=_number(body, "top_p", 1.0),
        seed=body.get("seed"),
        stop=stop_strings(body.get("stop")),
        ignore_eos=flag(body, "ignore_eos", False),
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
        return_token_ids=flag(body, "return_token_ids", False),
    )


def engine_job(
    rid: str, model: str, body: Mapping[str, Any], kind: str, config: ServerConfig, support: Support
) -> Job:
    stream = flag(body, "stream", False)
    if kind == CHAT:
        messages = _engine_messages(body.get("messages"))
        cont = _continue_final(body, messages)
        params = _engine_params(body, kind, config)
        return Job(rid, model, params, messages=tuple(messages), continue_final=cont, stream=stream)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    ids = isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    if ids and prompt:
        if "token_ids" not in support.features:
            raise InvalidRequest(
                f"a prompt of token ids is not supported by {support.engine} serving {model!r}; "
                "send the prompt as a string",
                param="prompt",
            )
        return Job(rid, model, _engine_params(body, kind, config), prompt=list(prompt), stream=stream)
    if isinstance(prompt, list) and not prompt:
        raise InvalidRequest("prompt must not be an empty list", param="prompt")
    if not isinstance(prompt, str):
        raise InvalidRequest("prompt must be a string or token ids (one prompt per request)", param="prompt")
    return Job(rid, model, _engine_params(body, kind, config), prompt=prompt, stream=stream)
