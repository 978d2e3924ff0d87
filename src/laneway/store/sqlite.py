"""The embedded store: one SQLite database (WAL) in the data directory.

:class:`SQLiteDB` is the synchronous implementation
(:class:`~laneway.store.threaded.SQLiteStore` runs it on a thread of its
own for the event loop). A lock file keeps a second server off the same data
directory; holding it, the store may treat every line left ``running`` as
orphaned by a crash and put it back in the queue when it opens.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from laneway.store import schema as q
from laneway.store.base import (
    BatchRecord,
    BatchStatus,
    ClaimedLine,
    FileRecord,
    LineState,
    LineView,
    NewLine,
    Outputs,
    StoreError,
    sources,
)
from laneway.store.data_dir import claim, release

_NO_SEQ = (1 << 63) - 1


def _marks(n: int) -> str:
    return ", ".join("?" * n)


def _batch(row: Sequence[Any]) -> BatchRecord:
    values = list(row)
    values[6] = BatchStatus(values[6])
    errors, metadata = values[21], values[22]
    values[21] = tuple(json.loads(errors)) if errors is not None else None
    values[22] = json.loads(metadata) if metadata is not None else None
    return BatchRecord(*values)


def _has_wal(path: Path) -> bool:
    wal = path.with_name(path.name + "-wal")
    return wal.exists() and wal.stat().st_size > 0


def _create(path: Path) -> None:
    """A new, empty store at ``path``: made beside it (owner-only) and renamed into place,
    so that a crash never leaves a half-made one."""
    new = path.with_name(path.name + ".new")
    new.unlink(missing_ok=True)
    os.close(os.open(new, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    conn = sqlite3.connect(new, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for stmt in q.CREATE:
            conn.execute(stmt)
        conn.execute(f"PRAGMA user_version={q.SCHEMA_VERSION}")
        conn.execute("COMMIT")
    finally:
        conn.close()
    fd = os.open(new, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(new, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class SQLiteDB:
    """The store's operations, synchronous, on one connection (use from one thread at a time)."""

    def __init__(self, data_dir: Path) -> None:
        self._lock = claim(data_dir)  # (private: other tenants' lines)
        self.path = data_dir / q.DB_NAME
        try:
            self._open()
        except sqlite3.Error as exc:
            release(self._lock)
            with contextlib.suppress(Exception):
                self.conn.close()
            raise StoreError(
                f"{self.path} cannot be used ({exc}); restore it from a backup, or move it "
                "away to start with an empty store"
            ) from None
        except BaseException:
            release(self._lock)
            raise

    def _open(self) -> None:
        if not self.path.exists():
            _create(self.path)
        elif self.path.stat().st_size == 0 and not _has_wal(self.path):
            # (laneway makes a new store whole, then renames it into place: an empty
            # file is something else, or a store that was lost; never start on it silently)
            raise StoreError(
                f"{self.path} is empty (0 bytes), not a laneway store; move it away to start "
                "with an empty store, or restore it from a backup"
            )
        self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        for pragma in q.PRAGMAS:
            self.conn.execute(pragma)
        problems = [row[0] for row in self.conn.execute("PRAGMA quick_check(1)")]
        if problems != ["ok"]:
            raise sqlite3.DatabaseError("damaged: " + " ".join(" ".join(problems).split()))
        with self._tx():
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
            if version > q.SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} was written by a newer laneway (store version {version}; "
                    f"this one reads up to {q.SCHEMA_VERSION})"
                )
            for stmt in q.CREATE:
                self.conn.execute(stmt)
            for old in range(version or q.SCHEMA_VERSION, q.SCHEMA_VERSION):  # none for a new store
                for stmt in q.MIGRATIONS[old]:
                    self.conn.execute(stmt)
            self.conn.execute(f"PRAGMA user_version={q.SCHEMA_VERSION}")
            # we hold the lock: whatever is still running was orphaned by a crash
            self.recovered = self.conn.execute(q.RELEASE_ALL).rowcount

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.conn.close()
        release(self._lock)

    # ------------------------------------------------------------------ files
    def put_file(self, r: FileRecord, content: bytes) -> None:
        with self._tx() as c:
            c.execute(q.INSERT_FILE, (r.id, r.tenant, r.purpose, r.filename, r.bytes, r.created_at, content))

    def get_file(self, file_id: str, tenant: str) -> FileRecord | None:
        row = self.conn.execute(q.GET_FILE, (file_id, tenant)).fetchone()
        return FileRecord(*row) if row is not None else None

    def file_content(self, file_id: str, tenant: str) -> bytes | None:
        row = self.conn.execute(q.GET_FILE_CONTENT, (file_id, tenant)).fetchone()
        return bytes(row[0]) if row is not None else None

    def list_files(
        self,
        tenant: str,
        *,
        limit: int,
        after: str | None = None,
        purpose: str | None = None,
        oldest_first: bool = False,
    ) -> tuple[list[FileRecord], bool]:
        seq = self._seq(q.FILE_SEQ, after, tenant)
        if seq is None:
            return [], False
        if oldest_first and after is None:
            seq = -1
        sql = (q.LIST_FILES_OLDEST if oldest_first else q.LIST_FILES).format(
            purpose="AND purpose = ?" if purpose is not None else ""
        )
        args: tuple[Any, ...] = (tenant, seq, *((purpose,) if purpose is not None else ()), limit + 1)
        rows = self.conn.execute(sql, args).fetchall()
        return [FileRecord(*r) for r in rows[:limit]], len(rows) > limit

    def delete_file(self, file_id: str, tenant: str) -> bool:
        with self._tx() as c:
            return c.execute(q.DELETE_FILE, (file_id, tenant)).rowcount == 1

    # ------------------------------------------------------------------ responses
    def put_response(self, response_id: str, tenant: str, created_at: int, record: str) -> None:
        with self._tx() as c:
            c.execute(q.PUT_RESPONSE, (response_id, tenant, created_at, record))

    def get_response(self, response_id: str, tenant: str) -> str | None:
        row = self.conn.execute(q.GET_RESPONSE, (response_id, tenant)).fetchone()
        return str(row[0]) if row is not None else None

    def delete_response(self, response_id: str, tenant: str) -> bool:
        with self._tx() as c:
            return c.execute(q.DELETE_RESPONSE, (response_id, tenant)).rowcount == 1

    def _seq(self, sql: str, after: str | None, tenant: str) -> int | None:
        if after is None:
            return _NO_SEQ
        row = self.conn.execute(sql, (after, tenant)).fetchone()
        return int(row[0]) if row is not None else None

    # ------------------------------------------------------------------ batches
    def create_batch(self, r: BatchRecord) -> None:
        meta = json.dumps(r.metadata) if r.metadata is not None else None
        with self._tx() as c:
            c.execute(
                q.INSERT_BATCH,
                (
                    r.id,
                    r.tenant,
                    r.endpoint,
                    r.input_file_id,
                    r.completion_window,
                    r.priority,
                    r.status.value,
                    r.created_at,
                    r.expires_at,
                    meta,
                ),
            )

    def get_batch(self, batch_id: str, tenant: str | None = None) -> BatchRecord | None:
        if tenant is None:
            row = self.conn.execute(q.GET_BATCH, (batch_id,)).fetchone()
        else:
            row = self.conn.execute(q.GET_TENANT_BATCH, (batch_id, tenant)).fetchone()
        return _batch(row) if row is not None else None

    def list_batches(
        self, tenant: str, *, limit: int, after: str | None = None
    ) -> tuple[list[BatchRecord], bool]:
        seq = self._seq(q.BATCH_SEQ, after, tenant)
        if seq is None:
            return [], False
        rows = self.conn.execute(q.LIST_BATCHES, (tenant, seq, limit + 1)).fetchall()
        return [_batch(r) for r in rows[:limit]], len(rows) > limit

    def batches_in(self, statuses: frozenset[BatchStatus]) -> list[BatchRecord]:
        names = sorted(s.value for s in statuses)
        rows = self.conn.execute(q.BATCHES_IN.format(marks=_marks(len(names))), names).fetchall()
        return [_batch(r) for r in rows]

    def set_status(self, batch_id: str, status: BatchStatus, now: int) -> bool:
        src = sorted(s.value for s in sources(status))
        sql = q.SET_STATUS.format(stamp=f"{status.value}_at", marks=_marks(len(src)))
        with self._tx() as c:
            return c.execute(sql, (status.value, now, batch_id, *src)).rowcount == 1

    def start_batch(self, batch_id: str, lines: Sequence[NewLine], now: int) -> bool:
        with self._tx() as c:
            if c.execute(q.START_BATCH, (now, len(lines), batch_id)).rowcount != 1:
                return False
            c.executemany(q.INSERT_LINE, ((batch_id, n.line_no, n.custom_id, n.body) for n in lines))
            return True

    def fail_batch(
        self,
        batch_id: str,
        errors: Sequence[dict[str, Any]],
        error_file: tuple[FileRecord, bytes] | None,
        now: int,
    ) -> bool:
        try:
            with self._tx() as c:
                file_id = None
                if error_file is not None:
                    r, content = error_file
                    c.execute(
                        q.INSERT_FILE, (r.id, r.tenant, r.purpose, r.filename, r.bytes, r.created_at, content)
                    )
                    file_id = r.id
                args = (now, json.dumps(list(errors)), file_id, batch_id)
                if c.execute(q.FAIL_BATCH, args).rowcount != 1:
                    raise _Rollback  # not validating any more (cancelled meanwhile): write nothing
        except _Rollback:
            return False
        return True

    # ------------------------------------------------------------------ lines
    def claim(self, batch_id: str, owner: str, limit: int, lease_s: float, now: float) -> list[ClaimedLine]:
        if limit <= 0:
            return []
        with self._tx() as c:
            nos = [r[0] for r in c.execute(q.CLAIMABLE_QUEUED, (batch_id, now, limit))]
            if len(nos) < limit:
                nos += [r[0] for r in c.execute(q.CLAIMABLE_EXPIRED, (batch_id, now, limit - len(nos)))]
            until = now + lease_s
            rows = [c.execute(q.CLAIM, (owner, until, batch_id, n)).fetchone() for n in nos]
            return [ClaimedLine(batch_id, *row) for row in rows]

    def renew(self, owner: str, lease_s: float, now: float, lines: Sequence[tuple[str, int]]) -> None:
        with self._tx() as c:
            c.executemany(q.RENEW, [(now + lease_s, b, n, owner) for b, n in lines])

    def finish(
        self, batch_id: str, line_no: int, owner: str, ok: bool, result: str, tokens: tuple[int, int] = (0, 0)
    ) -> bool:
        state = LineState.DONE if ok else LineState.FAILED
        with self._tx() as c:
            if c.execute(q.FINISH, (state.value, result, batch_id, line_no, owner)).rowcount != 1:
                return False
            if ok:
                c.execute(q.COUNT_DONE, (*tokens, batch_id))
            else:
                c.execute(q.COUNT_FAILED, (1, batch_id))
            return True

    def release(
        self, batch_id: str, line_no: int, owner: str, *, not_before: float, count_attempt: bool
    ) -> bool:
        undo = 0 if count_attempt else 1
        with self._tx() as c:
            return c.execute(q.RELEASE, (not_before, undo, batch_id, line_no, owner)).rowcount == 1

    def release_owner(self, owner: str) -> int:
        with self._tx() as c:
            return int(c.execute(q.RELEASE_OWNER, (owner,)).rowcount)

    def pending(self, batch_id: str) -> int:
        return int(self.conn.execute(q.PENDING, (batch_id,)).fetchone()[0])

    def finalize(
        self,
        batch_id: str,
        status: BatchStatus,
        outputs: Outputs,
        leftover: Callable[[str], str] | None,
        now: int,
    ) -> BatchRecord | None:
        src = sorted(s.value for s in sources(status))
        with self._tx() as c:
            rec = self.get_batch(batch_id)
            if rec is None or rec.status.value not in src:
                return None
            left = c.execute(q.LEFTOVERS, (batch_id,)).fetchall()
            if left:
                if leftover is None:
                    raise StoreError(f"batch {batch_id} still has {len(left)} lines to run")
                c.executemany(q.FAIL_LEFTOVER, ((leftover(cid), batch_id, n) for n, cid in left))
                c.execute(q.COUNT_FAILED, (len(left), batch_id))
            done: list[str] = []
            failed: list[str] = []
            for state, result in c.execute(q.RESULTS, (batch_id,)):
                (done if state == LineState.DONE.value else failed).append(result)
            out_id = self._write_output(rec, outputs.output_file_id, "output", done, outputs.created_at)
            err_id = self._write_output(rec, outputs.error_file_id, "error", failed, outputs.created_at)
            sql = q.SET_OUTPUTS.format(stamp=f"{status.value}_at", marks=_marks(len(src)))
            c.execute(sql, (status.value, now, out_id, err_id, batch_id, *src))
        return self.get_batch(batch_id)

    def _write_output(
        self, rec: BatchRecord, file_id: str, kind: str, lines: list[str], now: int
    ) -> str | None:
        if not lines:
            return None
        content = ("\n".join(lines) + "\n").encode("utf-8")
        name = f"{rec.id}_{kind}.jsonl"
        args = (file_id, rec.tenant, "batch_output", name, len(content), now, content)
        self.conn.execute(q.INSERT_FILE, args)
        return file_id

    def lines(self, batch_id: str) -> list[LineView]:
        rows = self.conn.execute(q.LINE_STATES, (batch_id,)).fetchall()
        return [LineView(n, cid, LineState(st), attempts, result) for n, cid, st, attempts, result in rows]


class _Rollback(Exception):
    pass
