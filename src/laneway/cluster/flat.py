"""A cluster message whose wire form is its fields in order, after its tag
(:class:`Flat`): how most events and orders of :mod:`laneway.cluster.codec` are laid out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any, ClassVar


def _coerce(annotation: str) -> Callable[[Any], Any]:
    """How a field of this annotation is read off the wire (JSON gave its value): numbers
    and flags made what they say, ``None`` kept where allowed, anything else as it came."""
    kind, _, optional = annotation.partition(" | ")
    make: Callable[[Any], Any] | None = {"int": int, "float": float, "bool": bool}.get(kind)
    if make is None:
        return lambda v: v
    if optional == "None":
        return lambda v: None if v is None else make(v)
    return make


class Flat:
    """A record whose wire form is its fields in order (after its tag). Trailing fields with
    defaults may be missing (an earlier version did not send them); numbers and flags are
    made what their annotation says."""

    __slots__ = ()
    TAG: ClassVar[str]

    def to_wire(self) -> list[Any]:
        return [getattr(self, f.name) for f in fields(self)]  # type: ignore[arg-type]

    @classmethod
    def from_wire(cls, items: list[Any]) -> Any:
        convert = _CONVERTERS.get(cls)
        if convert is None:  # (worked out once a kind: thousands of events a second are read)
            convert = _CONVERTERS[cls] = [_coerce(str(f.type)) for f in fields(cls)]  # type: ignore[arg-type]
        return cls(*(c(v) for c, v in zip(convert, items, strict=False)))


_CONVERTERS: dict[type, list[Callable[[Any], Any]]] = {}
