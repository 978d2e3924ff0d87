"""The ``laneway`` command: quiet on a Ctrl-C that comes while its modules still load."""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType


def _early_interrupt(sig: int, frame: FrameType | None) -> None:
    print("laneway: interrupted", file=sys.stderr, flush=True)
    os._exit(130)


def main() -> None:
    signal.signal(signal.SIGINT, _early_interrupt)  # (loading the modules takes a moment)
    from laneway.cli import main as run

    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(run())
