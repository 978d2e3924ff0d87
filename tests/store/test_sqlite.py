"""The SQLite store: files, batches, line claims and results, recovery, the data-dir lock."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from laneway.store import (
    BatchRecord,
    BatchStatus,
    FileRecord,
    LineState,
    NewLine,
    Outputs,
    SQLiteDB,
    SQLiteStore,
    StoreError,
)
from laneway.store.redis_db import RedisDB
from laneway.store.schema import SCHEMA_VERSION

LEASE = 30.0


def batch(
    bid: str = "batch_1", tenant: str = "t", status: BatchStatus = BatchStatus.VALIDATING
) -> BatchRecord:
    return BatchRecord(bid, tenant, "/v1/completions", "file-in", "24h", 2, status, 100, 100 + 86400)


def started(db: SQLiteDB, n: int, bid: str = "batch_1") -> None:
    db.create_batch(batch(bid))
    lines = [NewLine(i + 1, f"c{i}", json.dumps({"i": i})) for i in range(n)]
    assert db.start_batch(bid, lines, 101)


@pytest.fixture(params=["sqlite", "redis", "memory"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SQLiteDB]:
    """The embedded store and the shared one behave the same: both run these tests."""
    if request.param == "sqlite":
        d: Any = SQLiteDB(tmp_path)
    else:
        url = request.getfixturevalue("redis_url" if request.param == "redis" else "memory_bus")
        d = RedisDB(url, prefix=f"test:{uuid.uuid4().hex[:8]}:")
    yield d
    d.close()


def test_files_are_per_tenant_and_paginated(db: SQLiteDB) -> None:
    for i in range(5):
        db.put_file(FileRecord(f"file-{i}", "a", "batch", f"f{i}.jsonl", 3, 10 + i), b"abc")
    db.put_file(FileRecord("file-b", "b", "batch", "b.jsonl", 1, 20), b"x")
    assert db.get_file("file-b", "a") is None and db.file_content("file-b", "a") is None
    assert db.file_content("file-b", "b") == b"x"
    page, more = db.list_files("a", limit=2)
    assert [f.id for f in page] == ["file-4", "file-3"] and more
    page, more = db.list_files("a", limit=10, after="file-3")
    assert [f.id for f in page] == ["file-2", "file-1", "file-0"] and not more
    assert db.list_files("a", limit=10, after="file-b") == ([], False)  # another tenant's cursor
    page, more = db.list_files("a", limit=2, oldest_first=True)  # (order=asc)
    assert [f.id for f in page] == ["file-0", "file-1"] and more
    page, more = db.list_files("a", limit=10, after="file-1", oldest_first=True)
    assert [f.id for f in page] == ["file-2", "file-3", "file-4"] and not more
    assert not db.delete_file("file-b", "a") and db.delete_file("file-b", "b")
    assert db.get_file("file-b", "b") is None


def test_batch_status_follows_the_transition_table(db: SQLiteDB) -> None:
    db.create_batch(batch())
    assert not db.set_status("batch_1", BatchStatus.COMPLETED, 1)  # not from validating
    assert db.get_batch("batch_1", "other") is None
    assert db.start_batch("batch_1", [NewLine(1, "a", "{}")], 101)
    assert not db.start_batch("batch_1", [NewLine(2, "b", "{}")], 102)  # only once
    assert db.set_status("batch_1", BatchStatus.CANCELLING, 103)
    b = db.get_batch("batch_1", "t")
    assert b is not None and b.status is BatchStatus.CANCELLING and b.cancelling_at == 103 and b.total == 1
    assert not db.set_status("batch_1", BatchStatus.EXPIRED, 104)


def test_claim_finish_release_and_counts(db: SQLiteDB) -> None:
    started(db, 5)
    got = db.claim("batch_1", "A", 3, LEASE, 1000.0)
    assert [c.line_no for c in got] == [1, 2, 3] and all(c.attempts == 1 for c in got)
    assert [c.line_no for c in db.claim("batch_1", "B", 10, LEASE, 1000.0)] == [4, 5]
    assert not db.finish("batch_1", 1, "B", True, "r1")  # not B's
    assert db.finish("batch_1", 1, "A", True, '{"r":1}')
    assert not db.finish("batch_1", 1, "A", True, '{"r":1}')  # written once
    assert db.finish("batch_1", 2, "A", False, '{"e":2}')
    assert db.release("batch_1", 3, "A", not_before=1010.0, count_attempt=False)
    assert db.claim("batch_1", "A", 5, LEASE, 1005.0) == []  # line 3 waits until 1010
    again = db.claim("batch_1", "A", 5, LEASE, 1010.0)
    assert [(c.line_no, c.attempts) for c in again] == [(3, 1)]  # a deferral is not an attempt
    b = db.get_batch("batch_1")
    assert b is not None and (b.completed, b.failed, b.total) == (1, 1, 5)
    assert db.pending("batch_1") == 3
    assert db.release_owner("A") == 1 and db.release_owner("A") == 0  # an orderly stop of A
    assert [(c.line_no, c.attempts) for c in db.claim("batch_1", "C", 5, LEASE, 1010.0)] == [(3, 1)]


def test_expired_lease_is_claimable_and_the_stale_owner_loses(db: SQLiteDB) -> None:
    started(db, 1)
    db.claim("batch_1", "A", 1, LEASE, 1000.0)
    db.renew("A", LEASE, 1020.0, [("batch_1", 1)])  # lease until 1050
    assert db.claim("batch_1", "B", 1, LEASE, 1049.0) == []
    [b] = db.claim("batch_1", "B", 1, LEASE, 1051.0)
    assert b.attempts == 2
    assert not db.finish("batch_1", 1, "A", True, "late")
    assert db.finish("batch_1", 1, "B", True, '{"ok":1}')


def test_only_the_lines_an_owner_runs_are_renewed(db: SQLiteDB) -> None:
    """A line its owner holds but no longer runs (its result could not be written, its task
    is gone) runs out its lease and is claimed again; it is not kept alive for ever."""
    started(db, 2)
    db.claim("batch_1", "A", 2, LEASE, 1000.0)  # both until 1030
    db.renew("A", LEASE, 1020.0, [("batch_1", 1)])  # line 1 until 1050; line 2 is not run
    db.renew("B", LEASE, 1020.0, [("batch_1", 2)])  # (not B's: nothing changes)
    assert [c.line_no for c in db.claim("batch_1", "B", 2, LEASE, 1031.0)] == [2]


def test_one_result_per_custom_id_in_the_schema(db: SQLiteDB) -> None:
    db.create_batch(batch())
    with pytest.raises((sqlite3.IntegrityError, StoreError)):
        db.start_batch("batch_1", [NewLine(1, "same", "{}"), NewLine(2, "same", "{}")], 101)
    b = db.get_batch("batch_1")
    assert b is not None and b.status is BatchStatus.VALIDATING  # nothing of it was kept
    started(db, 1, "batch_2")
    db.claim("batch_2", "A", 1, LEASE, 1.0)
    assert db.finish("batch_2", 1, "A", True, "first")
    assert not db.finish("batch_2", 1, "A", True, "second")
    assert db.lines("batch_2")[0].result == "first"
    if isinstance(db, SQLiteDB):  # (and the schema itself refuses a second one)
        with pytest.raises(sqlite3.IntegrityError, match="written once"):
            db.conn.execute("UPDATE batch_lines SET result = 'second' WHERE batch_id = 'batch_2'")


def test_finalize_writes_files_in_line_order(db: SQLiteDB) -> None:
    started(db, 4)
    for c in db.claim("batch_1", "A", 4, LEASE, 1.0)[::-1]:
        db.finish("batch_1", c.line_no, "A", c.line_no != 3, json.dumps({"line": c.line_no}))
    outputs = Outputs("file-out", "file-err", 500)
    assert db.finalize("batch_1", BatchStatus.COMPLETED, outputs, None, 500) is None  # not finalizing yet
    assert db.set_status("batch_1", BatchStatus.FINALIZING, 499)
    b = db.finalize("batch_1", BatchStatus.COMPLETED, outputs, None, 500)
    assert b is not None and b.status is BatchStatus.COMPLETED and b.completed_at == 500
    assert (b.output_file_id, b.error_file_id) == ("file-out", "file-err")
    out = db.file_content("file-out", "t")
    assert out == b'{"line": 1}\n{"line": 2}\n{"line": 4}\n'
    assert db.file_content("file-err", "t") == b'{"line": 3}\n'
    meta = db.get_file("file-out", "t")
    assert meta is not None and meta.purpose == "batch_output" and meta.filename == "batch_1_output.jsonl"


def test_cancel_finalizes_leftovers_and_pending_lines_block_completion(db: SQLiteDB) -> None:
    started(db, 3)
    [c] = db.claim("batch_1", "A", 1, LEASE, 1.0)
    db.finish("batch_1", c.line_no, "A", True, "{}")
    db.claim("batch_1", "A", 1, LEASE, 1.0)  # line 2 running, line 3 queued
    assert db.set_status("batch_1", BatchStatus.CANCELLING, 2)
    b = db.finalize("batch_1", BatchStatus.CANCELLED, Outputs("o", "e", 3), lambda cid: f'"{cid}"', 3)
    assert b is not None and b.status is BatchStatus.CANCELLED and (b.completed, b.failed) == (1, 2)
    assert db.file_content("e", "t") == b'"c1"\n"c2"\n'
    assert all(v.state in (LineState.DONE, LineState.FAILED) for v in db.lines("batch_1"))
    started(db, 1, "batch_2")
    db.set_status("batch_2", BatchStatus.FINALIZING, 4)  # (a test shortcut: the line is still queued)
    with pytest.raises(StoreError, match="still has 1 lines"):
        db.finalize("batch_2", BatchStatus.COMPLETED, Outputs("o2", "e2", 5), None, 5)


def test_a_batch_cancelled_while_validated_gets_its_lines_all_answered_cancelled(db: SQLiteDB) -> None:
    """Cancelled before it started, its lines are written all the same and each is answered
    batch_cancelled: every custom_id is in one of its two files (none was, the total 0)."""
    db.create_batch(batch())
    assert db.set_status("batch_1", BatchStatus.CANCELLING, 101)
    lines = [NewLine(i + 1, f"c{i}", json.dumps({"i": i})) for i in range(3)]
    assert db.start_batch("batch_1", lines, 102)
    b = db.get_batch("batch_1")
    assert b is not None and b.status is BatchStatus.CANCELLING and b.total == 3 and b.in_progress_at is None
    assert not db.start_batch("batch_1", lines, 103)  # (once: its lines are not written twice)
    done = db.finalize("batch_1", BatchStatus.CANCELLED, Outputs("o", "e", 104), lambda cid: f'"{cid}"', 104)
    assert done is not None and done.status is BatchStatus.CANCELLED
    assert (done.completed, done.failed) == (0, 3)
    assert db.file_content("e", "t") == b'"c0"\n"c1"\n"c2"\n'
    # one found bad as it was cancelled fails with its errors all the same
    db.create_batch(batch("batch_2"))
    assert db.set_status("batch_2", BatchStatus.CANCELLING, 101)
    assert db.fail_batch("batch_2", [{"code": "x", "line": 1, "message": "bad", "param": None}], None, 102)
    b2 = db.get_batch("batch_2")
    assert b2 is not None and b2.status is BatchStatus.FAILED and len(b2.errors) == 1
    # one cancelled once it ran is not given lines again, nor failed
    started(db, 1, "batch_3")
    assert db.set_status("batch_3", BatchStatus.CANCELLING, 102)
    assert not db.start_batch("batch_3", lines, 103) and not db.fail_batch("batch_3", [], None, 103)


def test_validation_failure_records_errors_and_error_file(db: SQLiteDB) -> None:
    db.create_batch(batch())
    err = FileRecord("file-err", "t", "batch_output", "batch_1_error.jsonl", 2, 5)
    assert db.fail_batch(
        "batch_1", [{"code": "x", "line": 3, "message": "bad", "param": None}], (err, b"{}"), 5
    )
    b = db.get_batch("batch_1")
    assert (
        b is not None
        and b.status is BatchStatus.FAILED
        and b.errors == ({"code": "x", "line": 3, "message": "bad", "param": None},)
    )
    assert b.error_file_id == "file-err"
    assert not db.fail_batch("batch_1", [], None, 6)  # no longer validating: nothing written


def test_reopening_requeues_running_lines_and_the_lock_holds(tmp_path: Path) -> None:
    db = SQLiteDB(tmp_path)
    started(db, 3)
    db.claim("batch_1", "A", 2, LEASE, 1.0)
    with pytest.raises(StoreError, match="another laneway server"):
        SQLiteDB(tmp_path)
    db.close()  # (a crash: nothing released)
    again = SQLiteDB(tmp_path)
    try:
        assert again.recovered == 2
        assert [v.state for v in again.lines("batch_1")] == [LineState.QUEUED] * 3
        assert [c.attempts for c in again.claim("batch_1", "B", 3, LEASE, 2.0)] == [2, 2, 1]
    finally:
        again.close()


def test_async_store_runs_off_the_loop(tmp_path: Path) -> None:
    async def main() -> None:
        store = await SQLiteStore.open(tmp_path)
        try:
            await store.put_file(FileRecord("file-1", "", "batch", "a.jsonl", 1, 1), b"x")
            results = await asyncio.gather(*(store.file_content("file-1", "") for _ in range(20)))
            assert results == [b"x"] * 20
            await store.create_batch(batch(tenant=""))
            page, more = await store.list_batches("", limit=5)
            assert [b.id for b in page] == ["batch_1"] and not more
        finally:
            await store.close()

    asyncio.run(main())


def test_answered_lines_add_their_tokens_to_the_batch(db: SQLiteDB) -> None:
    started(db, 3)
    db.claim("batch_1", "A", 3, LEASE, 1000.0)
    assert db.finish("batch_1", 1, "A", True, "{}", (10, 4))
    assert db.finish("batch_1", 2, "A", True, "{}", (7, 2))
    assert not db.finish("batch_1", 2, "A", True, "{}", (7, 2))  # written once: counted once
    assert db.finish("batch_1", 3, "A", False, "{}")  # a failed line used no tokens
    b = db.get_batch("batch_1")
    assert b is not None and (b.input_tokens, b.output_tokens) == (17, 6)


def test_a_store_of_the_first_version_is_brought_up_to_date(tmp_path: Path) -> None:
    old = SQLiteDB(tmp_path)
    started(old, 1)
    old.close()
    raw = sqlite3.connect(tmp_path / "laneway.db")  # as the first version left it
    raw.execute("ALTER TABLE batches DROP COLUMN input_tokens")
    raw.execute("ALTER TABLE batches DROP COLUMN output_tokens")
    raw.execute("DROP TABLE responses")
    raw.execute("PRAGMA user_version=1")
    raw.commit()
    raw.close()
    db = SQLiteDB(tmp_path)
    try:
        b = db.get_batch("batch_1")
        assert b is not None and b.total == 1 and (b.input_tokens, b.output_tokens) == (0, 0)
        db.claim("batch_1", "A", 1, LEASE, 1000.0)
        assert db.finish("batch_1", 1, "A", True, "{}", (5, 3))
        b = db.get_batch("batch_1")
        assert b is not None and (b.input_tokens, b.output_tokens) == (5, 3)
        db.put_response("resp_1", "", 1, "{}")  # (version 3: stored responses)
        assert db.get_response("resp_1", "") == "{}"
        assert db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    finally:
        db.close()


def test_a_store_of_a_newer_version_is_refused(tmp_path: Path) -> None:
    SQLiteDB(tmp_path).close()
    raw = sqlite3.connect(tmp_path / "laneway.db")
    raw.execute("PRAGMA user_version=99")
    raw.close()
    with pytest.raises(StoreError, match="newer laneway"):
        SQLiteDB(tmp_path)
    raw = sqlite3.connect(tmp_path / "laneway.db")
    raw.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    raw.close()
    SQLiteDB(tmp_path).close()  # the refusal let the data directory's lock go


# ---------------------------------------------------------------------- a damaged or foreign file


def _filled(data_dir: Path, n: int = 400) -> Path:
    db = SQLiteDB(data_dir)
    for i in range(n):
        db.put_file(FileRecord(f"file-{i}", "t", "batch", "x.jsonl", 2000, 1), b"x" * 2000)
    db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return data_dir / "laneway.db"


def test_a_new_store_is_private_to_its_owner(tmp_path: Path) -> None:
    data = tmp_path / "data"
    SQLiteDB(data).close()
    assert data.stat().st_mode & 0o777 == 0o700
    assert (data / "laneway.db").stat().st_mode & 0o777 == 0o600
    assert not (data / "laneway.db.new").exists()


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage pages", "not sqlite"])
def test_a_damaged_store_is_refused_in_one_line_never_started_empty(tmp_path: Path, damage: str) -> None:
    path = _filled(tmp_path)
    raw = path.read_bytes()
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(raw[: len(raw) // 3])
    elif damage == "garbage pages":
        path.write_bytes(raw[:8192] + bytes(range(256)) * 64 + raw[8192 + 16384 :])
    else:
        path.write_bytes(b"hello, this is not a database\n" * 200)
    with pytest.raises(StoreError) as info:
        SQLiteDB(tmp_path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and "move it away" in message
    assert path.stat().st_size == len(path.read_bytes())  # left as it was for the user to look at
    path.unlink()
    SQLiteDB(tmp_path).close()  # the lock was let go: with the file moved away, it starts


def test_two_runners_starting_one_batch_at_once_leave_one_set_of_lines(db: SQLiteDB) -> None:
    """Both read it validating; one starts it; the other's start changes nothing."""
    db.create_batch(batch())
    first = [NewLine(i + 1, f"a{i}", "{}") for i in range(5)]
    second = [NewLine(i + 1, f"b{i}", "{}") for i in range(3)]
    assert db.start_batch("batch_1", first, 101)
    assert not db.start_batch("batch_1", second, 102)
    assert [v.custom_id for v in db.lines("batch_1")] == [f"a{i}" for i in range(5)]
    assert db.pending("batch_1") == 5
    if isinstance(db, RedisDB):  # the race itself: the other runner passed its check before the first began
        stage = f"{db.p}stage:late:"
        db.r.hset(stage + "ld:", mapping={"0000000001": '["b0", "{}"]'})
        db.r.hset(stage + "lst:", mapping={"0000000001": "q"})
        assert db._run("start_batch", "batch_1", 103, 1, stage) == 0
        assert [v.custom_id for v in db.lines("batch_1")] == [f"a{i}" for i in range(5)]
        assert not db.r.exists(stage + "ld:", stage + "lst:")
