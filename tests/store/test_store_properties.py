"""Every line ends exactly once, with one result per custom_id, whatever the interleaving of
claims, finishes, releases, lease expiries and crashes of several runners."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laneway.store import BatchRecord, BatchStatus, LineState, NewLine, Outputs, SQLiteDB
from laneway.store.redis_db import RedisDB

LEASE = 10.0
OWNERS = ("A", "B", "C")

op = st.one_of(
    st.tuples(st.just("claim"), st.sampled_from(OWNERS), st.integers(1, 4)),
    st.tuples(st.just("finish"), st.sampled_from(OWNERS), st.booleans()),
    st.tuples(st.just("release"), st.sampled_from(OWNERS), st.booleans()),
    st.tuples(st.just("expire"), st.sampled_from(OWNERS), st.just(0)),
    st.tuples(st.just("crash"), st.sampled_from(OWNERS), st.just(0)),
)


@pytest.fixture(params=["sqlite", "redis", "memory"])
def open_store(request: pytest.FixtureRequest) -> Callable[[Path, str], Any]:
    """Opens the store under test: SQLite in a directory, or Redis under a key prefix (a
    \"crash\" of a Redis store only drops the connection: the lines stay leased)."""
    if request.param == "sqlite":
        return lambda path, key: SQLiteDB(path)
    url = request.getfixturevalue("redis_url" if request.param == "redis" else "memory_bus")
    return lambda path, key: RedisDB(url, prefix=f"prop:{key}:")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 8), ops=st.lists(op, max_size=40))
def test_every_line_ends_exactly_once(
    open_store: Callable[[Path, str], Any], n: int, ops: list[tuple[str, str, object]]
) -> None:
    key = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as d:
        path = Path(d)
        db = open_store(path, key)
        db.create_batch(BatchRecord("b", "", "/v1/completions", "f", "24h", 2, BatchStatus.VALIDATING, 0, 9))
        db.start_batch("b", [NewLine(i + 1, f"c{i}", "{}") for i in range(n)], 0)
        now = 0.0
        held: dict[str, list[int]] = {o: [] for o in OWNERS}  # what each runner believes it holds
        written: dict[int, int] = {}  # line -> accepted results
        try:
            for name, owner, arg in ops:
                if name == "claim":
                    got = db.claim("b", owner, int(arg), LEASE, now)  # type: ignore[call-overload]
                    held[owner] += [c.line_no for c in got]
                elif name == "finish" and held[owner]:
                    line = held[owner].pop(0)
                    if db.finish("b", line, owner, bool(arg), f'{{"line":{line}}}'):
                        written[line] = written.get(line, 0) + 1
                elif name == "release" and held[owner]:
                    db.release("b", held[owner].pop(0), owner, not_before=now, count_attempt=bool(arg))
                elif name == "expire":  # the owner stalls past its lease; others may take its lines
                    now += LEASE + 1
                elif name == "crash":  # the process dies: the store is reopened, the runner forgets
                    db.close()
                    db = open_store(path, key)
                    held = {o: [] for o in OWNERS}
                now += 0.1
            # a fresh runner drains whatever is left
            for _ in range(n + 1):
                for c in db.claim("b", "Z", n, LEASE, now + 1000):
                    assert db.finish("b", c.line_no, "Z", True, f'{{"line":{c.line_no}}}')
                    written[c.line_no] = written.get(c.line_no, 0) + 1
            assert db.pending("b") == 0
            assert written == {i: 1 for i in range(1, n + 1)}
            assert all(v.state in (LineState.DONE, LineState.FAILED) for v in db.lines("b"))
            assert db.set_status("b", BatchStatus.FINALIZING, 1)
            b = db.finalize("b", BatchStatus.COMPLETED, Outputs("o", "e", 1), None, 1)
            assert b is not None and b.completed + b.failed == b.total == n
            lines = b"".join(db.file_content(i, "") or b"" for i in ("o", "e")).decode().splitlines()
            assert sorted(lines) == sorted(f'{{"line":{i}}}' for i in range(1, n + 1))
        finally:
            db.close()
