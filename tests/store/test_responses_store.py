"""Stored responses (the Responses API) in each store: one record per tenant and id, read,
replaced and deleted only under that tenant; the SQLite one survives a restart."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laneway.store import SQLiteDB, SQLiteStore
from laneway.store.redis_db import RedisDB

TENANTS = ("", "alice", "bob", 'a"b')  # (a name with a quote: keys cannot run into each other)
IDS = ("resp_1", "resp_2", '["alice", "resp_1"]')


@pytest.fixture(params=["sqlite", "redis", "memory"])
def open_db(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Any]:
    if request.param == "sqlite":
        return lambda: SQLiteDB(tmp_path / uuid.uuid4().hex)
    url = request.getfixturevalue("redis_url" if request.param == "redis" else "memory_bus")
    return lambda: RedisDB(url, prefix=f"resp:{uuid.uuid4().hex}:")


op = st.tuples(
    st.sampled_from(("put", "delete")), st.sampled_from(TENANTS), st.sampled_from(IDS), st.text(max_size=8)
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, max_size=30))
def test_each_tenant_reads_only_its_own_responses(
    open_db: Callable[[], Any], ops: list[tuple[str, str, str, str]]
) -> None:
    db = open_db()
    kept: dict[tuple[str, str], str] = {}
    try:
        for verb, tenant, rid, text in ops:
            if verb == "put":
                db.put_response(rid, tenant, 1, text)
                kept[(tenant, rid)] = text
            else:
                assert db.delete_response(rid, tenant) == ((tenant, rid) in kept)
                kept.pop((tenant, rid), None)
            for t in TENANTS:
                for i in IDS:
                    assert db.get_response(i, t) == kept.get((t, i))
    finally:
        db.close()


def test_the_sqlite_store_keeps_responses_across_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        store = await SQLiteStore.open(tmp_path)
        await store.put_response("resp_a", "alice", 5, '{"x": 1}')
        await store.close()
        again = await SQLiteStore.open(tmp_path)
        try:
            assert await again.get_response("resp_a", "alice") == '{"x": 1}'
            assert await again.get_response("resp_a", "bob") is None
            assert await again.delete_response("resp_a", "alice")
            assert await again.get_response("resp_a", "alice") is None
        finally:
            await again.close()

    asyncio.run(main())
