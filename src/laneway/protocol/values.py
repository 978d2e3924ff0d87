"""Reading the values laneway itself uses out of a request body, with errors naming the field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from laneway.errors import InvalidRequest
from laneway.generation import CHAT

MAX_TOKENS_LIMIT = 1 << 31  # a max_tokens beyond any context window is a mistake, not a wish


def flag(body: Mapping[str, Any], name: str, default: bool, within: str = "") -> bool:
    """``body[name]``, true or false; ``within``: the field ``body`` is (errors name the path)."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        path = f"{within}.{name}" if within else name
        raise InvalidRequest(f"{path} must be true or false, got {value!r}", param=path)
    return value


def stop_strings(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise InvalidRequest("stop must be a string or a list of strings", param="stop")


def max_tokens(body: Mapping[str, Any], kind: str) -> int | None:
    """The most tokens a request may make: a chat's ``max_completion_tokens`` where it gives
    one (as OpenAI and vLLM take it), else ``max_tokens``; each checked where given."""
    names = ("max_completion_tokens", "max_tokens") if kind == CHAT else ("max_tokens",)
    limit = None
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < MAX_TOKENS_LIMIT:
            raise InvalidRequest(
                f"{name} must be a whole number from 1 to {MAX_TOKENS_LIMIT - 1}, got {value!r}", param=name
            )
        limit = value if limit is None else limit
    return limit


def max_tokens_field(body: Mapping[str, Any], kind: str) -> str:
    """The field :func:`max_tokens` took the limit from (errors about it name it)."""
    given = kind == CHAT and body.get("max_completion_tokens") is not None
    return "max_completion_tokens" if given else "max_tokens"


def stream_options(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = flag(body, "stream", False)
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise InvalidRequest("stream_options must be an object", param="stream_options")
        if not stream:  # (as OpenAI and vLLM answer it)
            raise InvalidRequest("stream_options is only allowed when stream is true", param="stream_options")
        include_usage = flag(options, "include_usage", False, "stream_options")
    return stream, include_usage


def message_list(value: object) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise InvalidRequest("messages must be a non-empty list of message objects", param="messages")
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise InvalidRequest(
                f"messages[{i}] must be an object with a role and content", param=f"messages[{i}]"
            )
        if not isinstance(m.get("role"), str):
            raise InvalidRequest(f"messages[{i}].role must be a string", param=f"messages[{i}].role")
        if m.get("name") is not None and not isinstance(m["name"], str):  # (as OpenAI refuses it)
            raise InvalidRequest(
                f"messages[{i}].name must be a string, got {m['name']!r}", param=f"messages[{i}].name"
            )
    return value


def identifiers(body: Mapping[str, Any]) -> None:
    """``user``, ``safety_identifier`` and ``prompt_cache_key``: a client's labels, read and
    not used (an upstream is sent them); each a string, the last two at most 64 characters
    (OpenAI's bound)."""
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise InvalidRequest("user must be a string", param="user")
    for name in ("safety_identifier", "prompt_cache_key"):
        value = body.get(name)
        if value is not None and (not isinstance(value, str) or len(value) > 64):
            raise InvalidRequest(f"{name} must be a string of at most 64 characters", param=name)
