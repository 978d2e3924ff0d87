"""The stand-in engine's text: a "tokenizer" that makes a token of each UTF-8 byte of a
prompt (ids ``BYTE_BASE`` and up) and writes words (ids below 64) chosen from a seed and the
position, so a request resumed from its token ids writes exactly what it would have written
in one go."""

from __future__ import annotations

import zlib
from typing import Any

WORDS = (
    "the", "lane", "way", "queue", "token", "batch", "chat", "slot", "wait", "run", "fast", "slow",
    "class", "fair", "work", "done", "alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa",
    "lambda", "north", "south", "east", "west", "up", "down", "left", "right", "red", "green", "blue",
    "gold", "grey", "pink", "teal", "cyan", "one", "two", "three", "four", "five", "six", "seven",
    "eight", "nine", "ten", "copy", "move", "read", "write", "open", "close", "start", "stop", "send",
    "take", "give", "keep", "find", "make",
)  # fmt: skip
BYTE_BASE = 1000


def encode(text: str) -> list[int]:
    return [BYTE_BASE + b for b in text.encode("utf-8")]


def decode(ids: list[int]) -> str:
    out: list[str] = []
    raw = bytearray()
    for i in ids:
        if i >= BYTE_BASE:
            raw.append(i - BYTE_BASE)
            continue
        if raw:
            out.append(raw.decode("utf-8", "replace"))
            raw.clear()
        out.append(" " + WORDS[i % len(WORDS)])
    if raw:
        out.append(raw.decode("utf-8", "replace"))
    return "".join(out)


def chat_prompt(messages: list[dict[str, Any]], add_generation: bool) -> str:
    text = "".join(f"<{m.get('role')}>{m.get('content')}\n" for m in messages)
    return text + ("<assistant>" if add_generation else "")


def next_token(seed: int, position: int) -> int:
    return zlib.crc32(position.to_bytes(4, "little"), seed) % len(WORDS)
