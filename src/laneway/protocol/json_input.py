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

MAX_DEPTH = 64  # arrays and objects inside one another; tool schemas need far fewer
INT_LIMIT = 2**64  # integers must be in (-2^64, 2^64): a 64-bit seed, signed or not


class BadJSON(InvalidRequest):
    """Not JSON laneway can take; ``param`` names where (None: the text as a whole)."""


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def loads(data: bytes | str, what: str = "the body") -> Any:
    """The value in ``data``; :class:`BadJSON` when it is not JSON or breaks a rule above."""
    try:
        value = json.loads(data, parse_constant=_no_constant)
    except RecursionError:
        raise BadJSON(f"{what} is nested more than {MAX_DEPTH} levels deep") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadJSON(f"{what} is not valid JSON: {exc}") from None
    check(value, what)
    return value


def check(value: Any, what: str = "the body") -> None:
    """The rules above over a value already parsed."""
    # (value, depth, path parts) — the path is built only when something is wrong
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(value, 0, ())]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth, path = pop()
        kind = type(item)
        if kind is str:
            if not item.isascii() and _has_surrogate(item):
                raise BadJSON(f"{_name(path)} holds a lone UTF-16 surrogate", param=_param(path))
        elif kind is dict or kind is list:
            if depth >= MAX_DEPTH:
                raise BadJSON(f"{what} is nested more than {MAX_DEPTH} levels deep", param=_param(path))
            if kind is dict:
                for key, sub in item.items():
                    if not key.isascii() and _has_surrogate(key):
                        raise BadJSON(
                            f"a key in {_name(path)} holds a lone UTF-16 surrogate", param=_param(path)
                        )
                    if type(sub) in _SCALAR_OK:
                        continue
                    push((sub, depth + 1, (*path, key)))
            else:
                for i, sub in enumerate(item):
                    if type(sub) in _SCALAR_OK:
                        continue
                    push((sub, depth + 1, (*path, i)))
        elif kind is int:
            if not -INT_LIMIT < item < INT_LIMIT:
                raise BadJSON(
                    f"{_name(path)} is out of range (integers must fit in 64 bits)", param=_param(path)
                )
        elif kind is float and not math.isfinite(item):
            raise BadJSON(f"{_name(path)} is not a finite number", param=_param(path))


_SCALAR_OK = (bool, type(None))  # nothing to check in these


def _has_surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _param(path: tuple[str | int, ...]) -> str | None:
    if not path:
        return None
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _name(path: tuple[str | int, ...]) -> str:
    return _param(path) or "the value"
