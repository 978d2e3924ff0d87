"""The :class:`~laneway.store.base.Store` over a synchronous store (SQLite's
:class:`~laneway.store.sqlite.SQLiteDB`; Redis's :class:`~laneway.store.redis_db.RedisDB`,
in :mod:`laneway.store.redis_store`), run on one dedicated thread so the event loop never
waits on the disk or the network (one connection, one thread: every statement is
serialized, which is what SQLite wants anyway)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from laneway.store.base import (
    BatchRecord,
    BatchStatus,
    ClaimedLine,
    FileRecord,
    LineView,
    NewLine,
    Outputs,
)
from laneway.store.sqlite import SQLiteDB

T = TypeVar("T")


class ThreadedStore:
    """The :class:`~laneway.store.base.Store` over a synchronous one, on a thread of its own."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="laneway-store")

    async def _call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kw))

    async def put_file(self, record: FileRecord, content: bytes) -> None:
        await self._call(self.db.put_file, record, content)

    async def get_file(self, file_id: str, tenant: str) -> FileRecord | None:
        return await self._call(self.db.get_file, file_id, tenant)

    async def file_content(self, file_id: str, tenant: str) -> bytes | None:
        return await self._call(self.db.file_content, file_id, tenant)

    async def list_files(
        self,
        tenant: str,
        *,
        limit: int,
        after: str | None = None,
        purpose: str | None = None,
        oldest_first: bool = False,
    ) -> tuple[list[FileRecord], bool]:
        return await self._call(
            self.db.list_files, tenant, limit=limit, after=after, purpose=purpose, oldest_first=oldest_first
        )

    async def delete_file(self, file_id: str, tenant: str) -> bool:
        return await self._call(self.db.delete_file, file_id, tenant)

    async def put_response(self, response_id: str, tenant: str, created_at: int, record: str) -> None:
        await self._call(self.db.put_response, response_id, tenant, created_at, record)

    async def get_response(self, response_id: str, tenant: str) -> str | None:
        return await self._call(self.db.get_response, response_id, tenant)

    async def delete_response(self, response_id: str, tenant: str) -> bool:
        return await self._call(self.db.delete_response, response_id, tenant)

    async def create_batch(self, record: BatchRecord) -> None:
        await self._call(self.db.create_batch, record)

    async def get_batch(self, batch_id: str, tenant: str | None = None) -> BatchRecord | None:
        return await self._call(self.db.get_batch, batch_id, tenant)

    async def list_batches(
        self, tenant: str, *, limit: int, after: str | None = None
    ) -> tuple[list[BatchRecord], bool]:
        return await self._call(self.db.list_batches, tenant, limit=limit, after=after)

    async def batches_in(self, statuses: frozenset[BatchStatus]) -> list[BatchRecord]:
        return await self._call(self.db.batches_in, statuses)

    async def set_status(self, batch_id: str, status: BatchStatus, now: int) -> bool:
        return await self._call(self.db.set_status, batch_id, status, now)

    async def start_batch(self, batch_id: str, lines: Sequence[NewLine], now: int) -> bool:
        return await self._call(self.db.start_batch, batch_id, lines, now)

    async def fail_batch(
        self,
        batch_id: str,
        errors: Sequence[dict[str, Any]],
        error_file: tuple[FileRecord, bytes] | None,
        now: int,
    ) -> bool:
        return await self._call(self.db.fail_batch, batch_id, errors, error_file, now)

    async def claim(
        self, batch_id: str, owner: str, limit: int, lease_s: float, now: float
    ) -> list[ClaimedLine]:
        return await self._call(self.db.claim, batch_id, owner, limit, lease_s, now)

    async def lost(self, object_id: str) -> dict[str, Any] | None:
        lost = getattr(self.db, "lost", None)  # (only a shared store can lose what it held)
        return None if lost is None else await self._call(lost, object_id)

    async def renew(self, owner: str, lease_s: float, now: float, lines: Sequence[tuple[str, int]]) -> None:
        await self._call(self.db.renew, owner, lease_s, now, lines)

    async def finish(
        self, batch_id: str, line_no: int, owner: str, ok: bool, result: str, tokens: tuple[int, int] = (0, 0)
    ) -> bool:
        return await self._call(self.db.finish, batch_id, line_no, owner, ok, result, tokens)

    async def release(
        self, batch_id: str, line_no: int, owner: str, *, not_before: float, count_attempt: bool
    ) -> bool:
        return await self._call(
            self.db.release, batch_id, line_no, owner, not_before=not_before, count_attempt=count_attempt
        )

    async def release_owner(self, owner: str) -> int:
        return await self._call(self.db.release_owner, owner)

    async def pending(self, batch_id: str) -> int:
        return await self._call(self.db.pending, batch_id)

    async def finalize(
        self,
        batch_id: str,
        status: BatchStatus,
        outputs: Outputs,
        leftover: Callable[[str], str] | None,
        now: int,
    ) -> BatchRecord | None:
        return await self._call(self.db.finalize, batch_id, status, outputs, leftover, now)

    async def lines(self, batch_id: str) -> list[LineView]:
        return await self._call(self.db.lines, batch_id)

    async def close(self) -> None:
        await ThreadedStore._call(self, self.db.close)  # (a subclass's refusals do not keep it open)
        self._pool.shutdown(wait=True)


class SQLiteStore(ThreadedStore):
    """The embedded store: SQLite in the data directory."""

    @classmethod
    async def open(cls, data_dir: Path) -> SQLiteStore:
        return cls(await asyncio.to_thread(SQLiteDB, data_dir))


async def open_store(config: Any) -> ThreadedStore:
    """The store of ``config`` (a :class:`~laneway.config.ServerConfig`): Redis's when it names
    a ``[cluster]``, else SQLite's in its data directory."""
    cluster = config.cluster
    if cluster is not None:
        from laneway.store.redis_store import RedisStore

        return await RedisStore.open(
            cluster.redis_url, cluster.key_prefix, replicas=True, data_dir=config.data_dir
        )
    return await SQLiteStore.open(config.data_dir)
