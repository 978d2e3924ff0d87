"""Redis's replies as the cluster reads them: the client (without ``decode_responses``)
answers bytes, which its types leave as ``bytes | str``; these say what they are."""

from __future__ import annotations

from typing import Any


def text(value: bytes | str) -> str:
    """A key or a value, as text."""
    return value.decode() if isinstance(value, bytes) else value


def stream_entries(reply: Any) -> list[tuple[str, dict[bytes, bytes]]]:
    """The entries of an ``XREAD`` reply (of any number of streams), in order: (id, fields)."""
    out: list[tuple[str, dict[bytes, bytes]]] = []
    for _, entries in reply or ():
        for entry_id, fields in entries:
            out.append((text(entry_id), fields))
    return out


def text_map(reply: Any) -> dict[str, bytes]:
    """An ``HGETALL`` reply, its keys as text."""
    return {text(k): v for k, v in (reply or {}).items()}
