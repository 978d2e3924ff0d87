"""JSON on the request path, through orjson where it gives what Python's ``json`` gives.

Every request crosses JSON four times or more (the client's body, the body sent upstream,
each chunk the engine streams back, the answer): with the standard library that is ~15 %
of the gateway's samples in py-spy's profile of a 1-token chat; orjson does each in a fifth
of the time or less. The two
differ at the edges, so orjson is used only where the result is the same:

- :func:`loads`: orjson reads an integer beyond 64 bits as a float, where ``json`` keeps it
  exact: text with a run of 19 digits or more is read by ``json``. Whatever orjson refuses
  (``NaN``, ``1e400``, lone surrogate escapes, text that is not UTF-8, deep nesting) is read
  by ``json`` too, so the value, or the error, is the one it always was.
- :func:`dumps`: a compact encoding. orjson writes ``NaN`` as ``null`` (``json`` writes
  ``NaN``) and refuses lone surrogates, integers beyond 64 bits and keys that are not
  strings: a value with a float that is not finite, or one orjson refuses, is written by
  ``json``. Text past ASCII is written as UTF-8 (the same JSON), or, where the answer must
  be ASCII, by ``json``. Numbers may be spelt otherwise (``1e16`` for ``1e+16``): the same
  values.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

_LONG_DIGITS = re.compile(rb"\d{19}")  # (an integer that may not fit in 64 bits)


UNREAD: Any = object()  # what :func:`read` gives for text left to ``json``


def read(data: bytes | str) -> Any:
    """The value orjson reads in ``data`` where it is the one ``json`` reads, else
    :data:`UNREAD` (``json`` reads it: its value, or its error)."""
    if type(data) is bytes and _LONG_DIGITS.search(data) is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return UNREAD


def loads(data: bytes) -> Any:
    """``json.loads(data)``, sooner."""
    value = read(data)
    return json.loads(data) if value is UNREAD else value


def dumps(value: Any, *, ascii: bool = False) -> bytes:
    """``json.dumps(value, separators=(",", ":"))`` as bytes, sooner: UTF-8, or with
    ``ascii`` every character past ASCII escaped (as ``json`` does by default: a lone
    surrogate the engine made can be sent too)."""
    try:
        raw = orjson.dumps(value)
    except TypeError:
        raw = b""
    if (
        not raw
        or (ascii and not raw.isascii())
        or (b"null" in raw and _has_not_finite(value))  # (orjson wrote a NaN as null)
    ):
        return json.dumps(value, separators=(",", ":")).encode()
    return raw


def _has_not_finite(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is float:
            if not math.isfinite(item):
                return True
        elif kind is dict:
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
    return False
