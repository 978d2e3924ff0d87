"""Durable state behind one protocol (:class:`Store`); SQLite in the data directory by default."""

from laneway.store.base import (
    ACTIVE,
    TERMINAL,
    TRANSITIONS,
    BatchRecord,
    BatchStatus,
    ClaimedLine,
    FileRecord,
    LineState,
    LineView,
    NewLine,
    Outputs,
    Store,
)
from laneway.store.sqlite import SQLiteDB, StoreError, StoreUnavailable
from laneway.store.sqlite_store import RedisStore, SQLiteStore, ThreadedStore, open_store

__all__ = [
    "ACTIVE",
    "TERMINAL",
    "TRANSITIONS",
    "BatchRecord",
    "BatchStatus",
    "ClaimedLine",
    "FileRecord",
    "LineState",
    "LineView",
    "NewLine",
    "Outputs",
    "RedisStore",
    "SQLiteDB",
    "SQLiteStore",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "ThreadedStore",
    "open_store",
]
