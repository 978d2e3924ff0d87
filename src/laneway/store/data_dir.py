"""A server's data directory: private to its owner (0700, its files 0600: other tenants'
batch lines, file ids), and one server's at a time — the SQLite store's, or a cluster
replica's own state (its generation, its journal)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from laneway.store.base import StoreError

LOCK_NAME = "laneway.db.lock"


def claim(data_dir: Path) -> int:
    """Make ``data_dir`` (private) and lock it for this process: the lock's descriptor, to
    :func:`release` at the end. :class:`StoreError` where it cannot be used, or another
    server holds it."""
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(data_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise StoreError(f"cannot use the data directory {data_dir}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise StoreError(f"another laneway server is using the data directory {data_dir}") from None
    return fd


def release(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
