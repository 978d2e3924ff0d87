"""In a cluster, a line whose lease ran out is claimed again only once its owner's request
cannot still be running (the store's Redis also holds the replicas' liveness): not while
its owner says it lives (until a grace after the lease), not while the leader holds the
slots of an owner taken for dead (its engine still runs its requests), and an owner that
is neither after a longer grace."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import redis

from laneway.store import BatchRecord, BatchStatus, NewLine
from laneway.store.redis_db import CLAIM_GRACE_S, CLAIM_LONG_GRACE_S, RedisDB

LEASE = 30.0


@pytest.fixture
def db(redis_url: str) -> Iterator[RedisDB]:
    d = RedisDB(redis_url, prefix=f"claims:{uuid.uuid4().hex[:8]}:")
    d.claim_grace = (CLAIM_GRACE_S, CLAIM_LONG_GRACE_S)
    rec = BatchRecord("b1", "t", "/v1/completions", "file-in", "24h", 2, BatchStatus.VALIDATING, 100, 10**6)
    d.create_batch(rec)
    assert d.start_batch("b1", [NewLine(i + 1, f"c{i}", json.dumps({"i": i})) for i in range(3)], 101)
    yield d
    d.close()


def claimed(db: RedisDB, now: float) -> list[int]:
    return [c.line_no for c in db.claim("b1", "other.x", 3, LEASE, now)]


def test_a_line_of_an_owner_alive_waits_a_grace_past_its_lease(db: RedisDB) -> None:
    r: redis.Redis = db.r
    assert len(db.claim("b1", "r1.a", 1, LEASE, 1000.0)) == 1  # lease until 1030
    r.set(db.p + "alive:r1.a", "1")
    assert claimed(db, 1031.0) == [2, 3]  # (the queued ones)
    assert claimed(db, 1030.0 + CLAIM_GRACE_S - 0.5) == []
    assert claimed(db, 1030.0 + CLAIM_GRACE_S + 0.5) == [1]


def test_a_line_of_an_owner_taken_for_dead_waits_for_its_slots_to_be_let_go(db: RedisDB) -> None:
    r: redis.Redis = db.r
    assert len(db.claim("b1", "r1.a", 3, LEASE, 1000.0)) == 3
    r.set(db.p + "dead:r1.a", "1")
    r.hset(db.p + "loans", "r1.a|up0", json.dumps([0, 0, 2, 2, 2000.0]))  # held for it
    r.hset(db.p + "loans", "r1.ab|up0", json.dumps([2, 1, 0, 2, 0]))  # (another's loan)
    assert claimed(db, 1100.0) == []
    r.hdel(db.p + "loans", "r1.a|up0")  # its engine showed its requests gone
    assert claimed(db, 1100.0) == [1, 2, 3]


def test_a_line_of_an_owner_neither_alive_nor_dead_waits_longer(db: RedisDB) -> None:
    assert len(db.claim("b1", "r1.a", 1, LEASE, 1000.0)) == 1
    assert claimed(db, 1031.0) == [2, 3]
    assert claimed(db, 1030.0 + CLAIM_LONG_GRACE_S - 1) == []
    assert claimed(db, 1030.0 + CLAIM_LONG_GRACE_S + 1) == [1]


def test_a_line_of_an_owner_just_taken_for_dead_waits_for_the_commit_of_its_quarantine(
    db: RedisDB,
) -> None:
    """The leader takes an owner for dead in one script (its tombstone) and writes the slots
    its requests still hold in its next commit: in between, its lines are not claimed (two
    lines of a paused runner ran twice at once, claimed in that gap)."""
    from laneway.cluster.commit import COMMIT, commit_args
    from laneway.cluster.lending import Lender
    from laneway.cluster.liveness import REAP
    from laneway.core import WorkerSpec

    r: redis.Redis = db.r
    assert len(db.claim("b1", "r1.a", 3, LEASE, 1000.0)) == 3
    assert [h.decode() for h in r.eval(REAP, 0, db.p, 60, "r1.a")] == ["r1.a"]  # its heartbeat is gone
    assert claimed(db, 1100.0) == []  # dead, but its quarantine is not written yet
    lender = Lender([WorkerSpec("up0", 4)], reserve=1)
    lender.quarantine("r1.a", "up0", 3, until=2000.0)
    keys = [db.p + k for k in ("reqs", "events:pos", "loans", "applied")]
    r.eval(COMMIT, 4, *keys, *commit_args(db.p, "0-0", [], [], [], "me", lender, {}, ["r1.a"]))
    assert claimed(db, 1100.0) == []  # its quarantine holds them now
    r.hdel(db.p + "loans", "r1.a|up0")  # its engine showed its requests gone
    assert claimed(db, 1100.0) == [1, 2, 3]
