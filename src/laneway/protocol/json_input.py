"""JSON from clients, read as a hostile client may write it.

One reader for every body laneway accepts (the API's requests and the lines
of a batch input file). It refuses, with :class:`InvalidRequest` naming the
place (``messages[0].content``):

- nesting deeper than :data:`MAX_DEPTH` (Python's parser would recurse until
  it fails);
- a number that is not finite (``1e400``, ``NaN``, ``Infinity``) or an
  integer beyond 64 bits: nothing laneway or an engine reads needs more, and
  such numbers break arithmetic further on;
- a string or key with a lone UTF-16 surrogate (``"\\ud800"``): it cannot be
  encoded, so no tokenizer or upstream can take it.

The walk is iterative and touches each value once.
"""

from __future__ import annotations

import json
import math
from typing import Any

from laneway.errors import InvalidRequest
from laneway.protocol import json_fast

MAX_DEPTH = 64  # arrays and objects inside one another; tool schemas need far fewer
INT_LIMIT = 2**64  # integers must be in (-2^64, 2^64): a 64-bit seed, signed or not


class BadJSON(InvalidRequest):
    """Not JSON laneway can take; ``param`` names where (None: the text as a whole)."""


def loads(data: bytes | str, what: str = "the body") -> Any:
    """The value in ``data``; :class:`BadJSON` when it is not JSON or breaks a rule above."""
    value = json_fast.read(data)
    if value is not json_fast.UNREAD:
        check(value, what)
        return value
    if isinstance(data, bytes):  # (JSON is UTF-8: json.loads would take UTF-16 and -32 too)
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadJSON(f"{what} is not valid JSON: it is not UTF-8 text (byte {exc.start})") from None
    try:
        value = json.loads(data)  # (NaN and Infinity are read, then refused by check: by place)
    except RecursionError:
        raise BadJSON(f"{what} is nested more than {MAX_DEPTH} levels deep") from None
    except (ValueError, UnicodeDecodeError) as exc:
        if "integer string conversion" in str(exc):  # (Python's digit limit, before ours)
            raise BadJSON(
                f"{what} holds an integer of thousands of digits (integers must fit in 64 bits)"
            ) from None
        raise BadJSON(f"{what} is not valid JSON: {exc}") from None
    check(value, what)
    return value


def check(value: Any, what: str = "the body") -> None:
    """The rules above over a value already parsed."""
    kind = type(value)
    if kind is not dict and kind is not list:
        _scalar(value, None)
        return
    # (container, depth, where) — where is (parent's where, key), the path built only when
    # something is wrong; scalars are checked in their container's loop, never stacked
    stack: list[tuple[Any, int, Any]] = [(value, 0, None)]
    pop, push, isfinite = stack.pop, stack.append, math.isfinite
    while stack:
        item, depth, where = pop()
        if type(item) is dict:
            for key in item:
                if not key.isascii() and _has_surrogate(key):
                    raise BadJSON(
                        f"a key in {_name(where)} holds a lone UTF-16 surrogate", param=_param(where)
                    )
            pairs: Any = item.items()
        else:
            pairs = enumerate(item)
        for key, sub in pairs:
            kind = type(sub)
            if kind is str:
                if not sub.isascii() and _has_surrogate(sub):
                    _scalar(sub, (where, key))
            elif kind is int:
                if not -INT_LIMIT < sub < INT_LIMIT:
                    _scalar(sub, (where, key))
            elif kind is float:
                if not isfinite(sub):
                    _scalar(sub, (where, key))
            elif kind is dict or kind is list:
                if depth + 1 >= MAX_DEPTH:
                    raise BadJSON(
                        f"{what} is nested more than {MAX_DEPTH} levels deep", param=_param((where, key))
                    )
                if sub:
                    push((sub, depth + 1, (where, key)))


def _scalar(item: Any, where: Any) -> None:
    """Refuse ``item`` if it breaks a rule (the slow path, with its place named)."""
    kind = type(item)
    if kind is str:
        if not item.isascii() and _has_surrogate(item):
            raise BadJSON(f"{_name(where)} holds a lone UTF-16 surrogate", param=_param(where))
    elif kind is int:
        if not -INT_LIMIT < item < INT_LIMIT:
            raise BadJSON(
                f"{_name(where)} is out of range (integers must fit in 64 bits)", param=_param(where)
            )
    elif kind is float and not math.isfinite(item):
        raise BadJSON(f"{_name(where)} is not a finite number", param=_param(where))


def _has_surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _param(where: Any) -> str | None:
    """``where`` as a parameter name (``messages[0].content``); None at the top."""
    path: list[str | int] = []
    while where is not None:
        where, key = where
        path.append(key)
    if not path:
        return None
    out = ""
    for part in reversed(path):
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _name(where: Any) -> str:
    return _param(where) or "the value"
