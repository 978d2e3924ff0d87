"""Reading typed values out of a TOML table, with errors that name the key."""

from __future__ import annotations

import builtins
import math
from collections.abc import Mapping
from typing import Any

from laneway.core import ConfigError

_MISSING = object()
REQUIRED = _MISSING  # a default that makes the key required


class Table:
    """A TOML table at ``path`` (``""`` for the top level); every key read is
    remembered so :meth:`done` can refuse the ones nobody knows."""

    def __init__(self, data: object, path: str = "") -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path or 'config'}: expected a table")
        self.data: Mapping[str, Any] = data
        self.path = path
        self._read: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def __contains__(self, name: str) -> bool:
        return name in self.data

    def raw(self, name: str, default: Any = _MISSING) -> Any:
        self._read.add(name)
        if name not in self.data:
            if default is _MISSING:
                raise ConfigError(f"{self.key(name)}: required")
            return default
        return self.data[name]

    def table(self, name: str) -> Table:
        return Table(self.raw(name, {}), self.key(name))

    def str(self, name: str, default: Any = _MISSING) -> Any:
        value = self.raw(name, default)
        if value is not default and (not isinstance(value, str) or not value):
            raise ConfigError(f"{self.key(name)}: expected a non-empty string, got {value!r}")
        return value

    def label(self, name: builtins.str, default: Any = _MISSING) -> Any:
        """A name shown in logs and metrics: a non-empty string without control characters."""
        value = self.str(name, default)
        if isinstance(value, builtins.str) and not value.isprintable():
            raise ConfigError(f"{self.key(name)}: expected a name without control characters, got {value!r}")
        return value

    def int(
        self,
        name: builtins.str,
        default: Any = _MISSING,
        *,
        low: builtins.int | None = None,
        high: builtins.int | None = None,
        optional: bool = False,
    ) -> Any:
        """A whole number; with ``optional``, the string ``"none"`` (or ``false``) gives ``None``."""
        value = self.raw(name, default)
        if value is default:
            return value
        if optional and (value is False or (isinstance(value, str) and value.lower() == "none")):
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            what = 'a whole number (or "none")' if optional else "a whole number"
            raise ConfigError(f"{self.key(name)}: expected {what}, got {value!r}")
        if low is not None and value < low:
            raise ConfigError(f"{self.key(name)}: must be >= {low}, got {value}")
        if high is not None and value > high:
            raise ConfigError(f"{self.key(name)}: must be <= {high}, got {value}")
        return value

    def float(
        self, name: builtins.str, default: Any = _MISSING, *, positive: bool = False, optional: bool = False
    ) -> Any:
        """A number; with ``optional``, the string ``"none"`` (or ``false``) gives ``None``."""
        value = self.raw(name, default)
        if value is default:
            return value
        if optional and (value is False or (isinstance(value, str) and value.lower() == "none")):
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            what = 'a number (or "none")' if optional else "a number"
            raise ConfigError(f"{self.key(name)}: expected {what}, got {value!r}")
        if positive and value <= 0:
            raise ConfigError(f"{self.key(name)}: must be > 0, got {value}")
        if value < 0:
            raise ConfigError(f"{self.key(name)}: must be >= 0, got {value}")
        return float(value)

    def bool(self, name: builtins.str, default: Any = _MISSING) -> Any:
        value = self.raw(name, default)
        if value is not default and not isinstance(value, bool):
            raise ConfigError(f"{self.key(name)}: expected true or false, got {value!r}")
        return value

    def list(self, name: builtins.str, default: Any = _MISSING) -> Any:
        value = self.raw(name, default)
        if value is not default and not isinstance(value, list):
            raise ConfigError(f"{self.key(name)}: expected a list, got {value!r}")
        return value

    def done(self) -> None:
        """Refuse keys that were never read (a typo should not pass silently)."""
        unknown = [k for k in self.data if k not in self._read]
        if unknown:
            raise ConfigError(f"{self.key(unknown[0])}: unknown key")


def rank(table: Table, name: str, names: tuple[str, ...], default: Any) -> Any:
    """``table[name]`` as a class's rank (as :func:`parse_rank` reads one), or ``default``."""
    value = table.raw(name, default)
    if value is default:
        return value
    try:
        return parse_rank(value, names)
    except ValueError as exc:
        raise ConfigError(f"{table.key(name)}: {exc}") from None


def parse_rank(value: object, names: tuple[str, ...]) -> int:
    """``2``, ``"2"``, ``"P2"`` or ``"p2"`` -> 2."""
    if isinstance(value, str):
        lowered = [n.lower() for n in names]
        if value.strip().lower() in lowered:
            return lowered.index(value.strip().lower())
        if value.strip().isdigit():
            value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return value
    raise ValueError(f"unknown class {value!r}: expected one of {', '.join(names)} (or 0–{len(names) - 1})")
