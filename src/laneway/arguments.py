"""Types of command-line arguments (argparse ``type=``): each refuses what it cannot take
with one line naming the argument, never a traceback."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


class OneLine(argparse.ArgumentParser):
    """A parser whose refusal is one line (``PROG: error: ...``, exit status 2), not its
    usage block: ``--help`` has that."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def positive_int(text: str) -> int:
    value = whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def up_to(limit: int, least: int = 1, why: str = "") -> Callable[[str], int]:
    """A whole number from ``least`` (1; ``why``: why more) to ``limit``: a size past what a
    run can hold in memory is refused in one line, not met minutes later by a ``MemoryError``."""

    def bounded(text: str) -> int:
        value = whole(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least:,}{why}, got {value:,}")
        if value > limit:
            raise argparse.ArgumentTypeError(f"must be at most {limit:,}, got {value:,}")
        return value

    return bounded


def seconds(text: str) -> float:
    """A finite number of seconds, 0 or more (also milliseconds: any finite amount of time)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def seconds_up_to(limit: float, *, positive: bool = False) -> Callable[[str], float]:
    """:func:`seconds` at most ``limit`` (and more than 0 where ``positive``)."""

    def parse(text: str) -> float:
        value = seconds(text)
        if positive and value == 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
        if value > limit:
            raise argparse.ArgumentTypeError(f"must be at most {limit:,g} s, got {text!r}")
        return value

    return parse


def path(text: str) -> Path:
    """A file's or folder's path: not empty (``""`` would be the current folder, quietly)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return Path(text)


def port(text: str) -> int:
    value = whole(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0–65535, got {value}")
    return value
