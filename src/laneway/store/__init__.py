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
    StoreError,
    StoreUnavailable,
)
from laneway.store.redis_store import RedisStore
from laneway.store.sqlite import SQLiteDB
from laneway.store.threaded import SQLiteStore, ThreadedStore, open_store

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
