"""A whole answer from an upstream's stream of chunks.

laneway streams from an upstream even when its client does not (so that a
preemption keeps what was generated). :class:`Assembly` folds the chunks
into the object the upstream would have answered without streaming: text and
argument strings are concatenated, lists of objects with an ``index``
(choices, tool calls) are merged entry by entry, other lists (log-probability
entries, token ids) are extended, and identifying values (``index``,
``type``, ``id``, ``role``, finish reasons) are replaced, not concatenated.
Chunk objects become their whole-answer counterparts (``delta`` ->
``message``; ``chat.completion.chunk`` -> ``chat.completion``).
"""

from __future__ import annotations

from typing import Any

REPLACED = frozenset(
    {
        "index",
        "type",
        "id",
        "role",
        "finish_reason",
        "stop_reason",
        "object",
        "created",
        "model",
        "system_fingerprint",
    }
)
OBJECTS = {"chat.completion.chunk": "chat.completion"}


def _copy(value: Any) -> Any:
    """A copy of a JSON value (dicts and lists copied all the way down; several times
    faster than ``copy.deepcopy``, which this is on the tree of a parsed chunk)."""
    if isinstance(value, dict):
        return {k: _copy(v) if isinstance(v, dict | list) else v for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) if isinstance(v, dict | list) else v for v in value]
    return value


def merge(acc: dict[str, Any], delta: dict[str, Any]) -> None:
    """Fold ``delta`` into ``acc`` (in place)."""
    for key, value in delta.items():
        old = acc.get(key)
        if old is None or key in REPLACED:
            if value is not None or key not in acc:
                acc[key] = _copy(value) if isinstance(value, dict | list) else value
        elif isinstance(old, str) and isinstance(value, str):
            acc[key] = old + value
        elif isinstance(old, dict) and isinstance(value, dict):
            merge(old, value)
        elif isinstance(old, list) and isinstance(value, list):
            _merge_list(old, value)
        elif value is not None:
            acc[key] = value


def _indexed(items: list[Any]) -> bool:
    return all(isinstance(x, dict) and "index" in x for x in items)


def _merge_list(old: list[Any], new: list[Any]) -> None:
    if new and _indexed(new) and _indexed(old):
        for entry in new:
            for have in old:
                if have["index"] == entry["index"]:
                    merge(have, entry)
                    break
            else:
                old.append(_copy(entry))
        old.sort(key=lambda e: e["index"])
    else:
        old.extend(_copy(new))


class Assembly:
    """The chunks of one answer so far, and the whole answer they make."""

    def __init__(self) -> None:
        self.acc: dict[str, Any] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        part = {k: v for k, v in chunk.items() if k != "usage"}  # usage is the whole run's, set at the end
        merge(self.acc, part)

    def answer(self, usage: dict[str, Any] | None) -> dict[str, Any]:
        out = _copy(self.acc)
        out["object"] = OBJECTS.get(out.get("object", ""), out.get("object", "text_completion"))
        for choice in out.get("choices") or ():
            if "delta" in choice:
                message = choice.pop("delta") or {}
                message.setdefault("role", "assistant")
                message.setdefault("content", None)
                message.setdefault("refusal", None)
                choice["message"] = message
                choice.setdefault("logprobs", None)
                # re-insert in OpenAI's order: index, message, logprobs, finish_reason
                for key in ("logprobs", "finish_reason"):
                    if key in choice:
                        choice[key] = choice.pop(key)
        if usage is not None:
            out["usage"] = usage
        return out
