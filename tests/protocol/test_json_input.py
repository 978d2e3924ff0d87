"""The one reader of clients' JSON: anything that is not JSON laneway can take is a
``BadJSON`` (a 400) naming where, never another exception."""

from __future__ import annotations

import contextlib
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laneway.protocol import json_input
from laneway.protocol.json_input import INT_LIMIT, MAX_DEPTH, BadJSON


@pytest.mark.parametrize(
    ("text", "param", "says"),
    [
        ("[" * 100_000 + "]" * 100_000, None, "nested"),
        (
            '{"a": ' + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "}",
            "a" + "[0]" * (MAX_DEPTH - 1),
            "nested",
        ),
        ('{"temperature": 1' + "0" * 400 + "}", "temperature", "64 bits"),
        ('{"seed": -18446744073709551616}', "seed", "64 bits"),
        ('{"top_p": 1e400}', "top_p", "finite"),
        ('{"x": [1, {"y": NaN}]}', "x[1].y", "finite"),  # (named by place, as 1e400 is)
        ('{"x": -Infinity}', "x", "finite"),
        ('{"messages": [{"content": "\\ud800"}]}', "messages[0].content", "surrogate"),
        ('{"k\\udfff": 1}', None, "surrogate"),
        ('{"a": 1', None, "not valid JSON"),
        (b'{"a": "\xff"}', None, "not valid JSON"),
        ("1" * 5000, None, "64 bits"),  # past Python's digit limit for int()
        ('{"seed": ' + "9" * 5001 + "}", None, "thousands of digits"),
    ],
)
def test_what_is_refused_and_where(text: str | bytes, param: str | None, says: str) -> None:
    with pytest.raises(BadJSON) as info:
        json_input.loads(text)
    assert info.value.param == param and says in info.value.message
    assert info.value.status == 400


def test_what_is_taken() -> None:
    value = {"a": [1.5, -(INT_LIMIT - 1), INT_LIMIT - 1, "é😀", None, True], "b": {"c": "x" * 1000}}
    assert json_input.loads(json.dumps(value)) == value
    deep: object = 1
    for _ in range(MAX_DEPTH):
        deep = [deep]
    assert json_input.loads(json.dumps(deep)) == deep


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec=None, blacklist_categories=())),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_value_is_taken_or_refused_never_crashes(value: object) -> None:
    text = json.dumps(value)  # (lone surrogates are written as \\udXXX escapes)
    try:
        got = json_input.loads(text)
    except BadJSON as exc:
        assert exc.message
        return
    assert got == value
    assert _fits(value)


def _fits(value: object) -> bool:
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, int):
        return abs(value) < INT_LIMIT
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, list):
        return all(_fits(v) for v in value)
    assert isinstance(value, dict)
    return all(_fits(k) and _fits(v) for k, v in value.items())


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200))
def test_any_bytes_are_taken_or_refused(data: bytes | str) -> None:
    with contextlib.suppress(BadJSON):
        json_input.loads(data)
