"""Files of a server's data directory, readable by their owner only (0600): other tenants'
batch lines and file ids are in them."""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """Write ``path`` whole (a temporary file renamed into place), readable by its owner only."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o600)  # (one left by an older run may have been another mode)
    os.replace(tmp, path)


def append_private(path: Path, text: str) -> None:
    """Append ``text`` to ``path``, made readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(text)
