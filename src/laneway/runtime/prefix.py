"""A prompt's prefix identity: a chain of block hashes over the prompt as the engine sees it.

The prompt is read in order — a chat's messages, system first (role, name, content, tool
calls), a completion's text or token ids — and cut into blocks of :data:`BLOCK_CHARS`
characters (:data:`BLOCK_IDS` ids); block ``i``'s hash is that of everything up to its end,
so two prompts share their first ``k`` hashes exactly when they share their first ``k``
blocks. The core's prefix index (:mod:`laneway.core.prefix_cache`) matches these against
what each engine was sent. The hashes are CRC-32 and Adler-32 of the prefix (64 bits: a
false match among the thousands of blocks an engine holds is a chance in ~10^15), the same
in every process (a cluster's replicas compute them, its leader compares them), and cheap:
both are carried on from one block to the next, in C.

A block of 128 characters is ~32 tokens of English: fine enough for a system prompt
shared by many requests, and a 3,000-character prompt costs ~24 hashes (µs: see
``bench/prefix_bench.py``).
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Sequence
from typing import Any
from zlib import adler32, crc32

from laneway.generation import Job

BLOCK_CHARS = 128
BLOCK_IDS = 32
MAX_BLOCKS = 4096  # (a prompt of over ~500k characters: its first blocks are enough)
_SEP_FIELD, _SEP_MESSAGE = "\x1f", "\x1e"


def chain(data: bytes, block: int) -> tuple[int, ...]:
    """The hashes of ``data``'s prefixes at each whole ``block`` bytes (a last partial block
    is left out: an engine caches whole blocks only): CRC-32 and Adler-32 of the prefix,
    each carried on from the last block's, as one 64-bit number."""
    out = []
    crc, adler = 0, 1
    end = min(len(data) // block, MAX_BLOCKS) * block
    view = memoryview(data)
    for i in range(0, end, block):
        piece = view[i : i + block]
        crc, adler = crc32(piece, crc), adler32(piece, adler)
        out.append(crc << 32 | adler)
    return tuple(out)


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    parts.append(text)
                else:  # an image, an audio clip …: what names it
                    parts.append(json.dumps(part, sort_keys=True, separators=(",", ":")))
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return "" if content is None else json.dumps(content, sort_keys=True)


def chat_text(messages: Iterable[Any]) -> str:
    """The messages as one string, in order: what the engine's chat template lays out."""
    out = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        role, name = m.get("role"), m.get("name")
        out.append(f"{role}{_SEP_FIELD}{name or ''}{_SEP_FIELD}{_content(m.get('content'))}")
        calls = m.get("tool_calls")
        if calls:
            out.append(json.dumps(calls, sort_keys=True, separators=(",", ":")))
        out.append(_SEP_MESSAGE)
    return "".join(out)


def of_prompt(prompt: object) -> tuple[int, ...]:
    """A completion's prompt: text, or token ids; several prompts (a list of them) or
    anything else: none."""
    if isinstance(prompt, str):
        return chain(prompt.encode("utf-8", "surrogatepass"), BLOCK_CHARS)
    if isinstance(prompt, list) and prompt and all(type(t) is int and 0 <= t < 1 << 32 for t in prompt):
        return chain(array("I", prompt).tobytes(), BLOCK_IDS * 4)
    return ()


def of_messages(messages: Sequence[Any]) -> tuple[int, ...]:
    return chain(chat_text(messages).encode("utf-8", "surrogatepass"), BLOCK_CHARS)


def prefix_of(job: Job) -> tuple[int, ...]:
    """``job``'s prefix identity (empty: none to match, e.g. embeddings)."""
    if job.messages is not None:
        return of_messages(job.messages)
    if job.prompt is not None:
        return of_prompt(job.prompt)
    return ()
