"""laneway.protocol.json_fast gives what Python's json gives: the same values, the same errors."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laneway.protocol import json_fast

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)  # (beyond 64 bits both ways)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN, and of the same types all the way down (1 is not 1.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b  # type: ignore[arg-type]
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)  # type: ignore[index]
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    return a == b


@settings(max_examples=300, deadline=None)
@given(values)
def test_what_it_writes_reads_back_as_what_json_wrote(value: object) -> None:
    ours = json_fast.dumps(value)
    theirs = json.dumps(value, separators=(",", ":")).encode()
    assert same(json.loads(ours), json.loads(theirs)), (ours, theirs)
    assert same(json_fast.loads(ours), json.loads(theirs))
    assert same(json_fast.loads(theirs), json.loads(theirs))


@pytest.mark.parametrize(
    "text",
    [
        b"18446744073709551615",  # 2**64 - 1: orjson's last exact integer
        b"-18446744073709551615",  # orjson reads this as a float
        b"[123456789012345678901234567890]",
        b'{"seed": -9223372036854775809}',
        b"NaN",
        b"[-Infinity]",
        b"1e400",
        b'"\\ud800"',  # a lone surrogate escape
        b'{"a": 1, "a": 2}',
        b"[1.0, -0.0, 0, 1E2, 5e-324]",
        b'"caf\xc3\xa9 \\u00e9"',
    ],
)
def test_edge_cases_read_as_json_reads_them(text: bytes) -> None:
    assert same(json_fast.loads(text), json.loads(text))


@pytest.mark.parametrize("text", [b"", b"{", b"[1,]", b"\xff", b'{"a" 1}', b"01"])
def test_what_json_refuses_it_refuses(text: bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        json_fast.loads(text)


def test_not_finite_floats_and_lone_surrogates_are_written_as_json_writes_them() -> None:
    for value in ({"x": [float("nan"), None]}, [float("-inf")], "\ud800", {"k": 2**70}, {1: "a"}):
        assert json_fast.dumps(value) == json.dumps(value, separators=(",", ":")).encode()
