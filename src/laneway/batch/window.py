"""A batch's ``completion_window``: ``"24h"``, ``"90m"``, ``"2d"``, ... (no other laneway imports:
the ``laneway batch`` command checks ``--window`` with it before it talks to a server)."""

from __future__ import annotations

import re

MAX_WINDOW_S = 30 * 86400
_WINDOW = re.compile(r"^\s*([0-9]+)\s*([smhd])\s*$", re.ASCII)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def window_seconds(text: object) -> int:
    """``"24h"`` → 86400 (also ``s``, ``m``, ``d``); ``ValueError`` if it is not such a duration."""
    m = _WINDOW.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"completion_window must be a duration like '24h' (s, m, h or d), got {text!r}")
    seconds = int(m.group(1)) * _UNIT_S[m.group(2)]
    if not 1 <= seconds <= MAX_WINDOW_S:
        raise ValueError(f"completion_window must be between 1s and 30d, got {text!r}")
    return seconds
