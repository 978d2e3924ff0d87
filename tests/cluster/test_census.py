"""The leader's census and dead homes, on a real core: what a replica reports is taken in
(running where it runs, queued otherwise, ended where it no longer reports it); a dead
home's requests are cancelled and the slots they ran on held until the engine shows them
gone, or their time limit."""

from __future__ import annotations

import asyncio

from laneway.cluster.census import take_census, take_in
from laneway.cluster.codec import Census, Sent, TableEntry
from laneway.cluster.dead_homes import LENT_HOLD_S, QUARANTINE_GRACE_S, cancel_dead, release_quarantines
from laneway.cluster.lending import Lender
from laneway.cluster.table import LiveTable
from laneway.core import Dispatch, Scheduler, WorkerSpec

SPECS = [WorkerSpec("w0", 2), WorkerSpec("w1", 2)]


def sent(rid: str, home: str = "a", est: float | None = 1.0) -> Sent:
    return Sent(rid, home, 1, 0.0, est_service_s=est)


def test_take_in_adopts_where_the_worker_can_hold_it_and_queues_what_it_cannot() -> None:
    core, table = Scheduler(SPECS), LiveTable()
    for i in range(3):  # w0 holds two
        assert take_in(core, table, f"r{i}", TableEntry(sent(f"r{i}")).on("w0"), 0.0) is None
    assert [table.entries[f"r{i}"].running for i in range(3)] == [True, True, False]
    assert core.workers["w0"].running.keys() == {"r0", "r1"}
    assert core.queued == 1
    # one on a worker the core does not know is queued
    assert take_in(core, table, "r3", TableEntry(sent("r3")).on("gone"), 0.0) is None
    assert not table.entries["r3"].running and core.queued == 2


def test_a_census_ends_what_its_home_no_longer_reports_and_takes_in_the_rest() -> None:
    core, table, lender = Scheduler(SPECS), LiveTable(), Lender(SPECS, 0)
    for rid in ("old", "lost", "queued"):
        assert core.submit(sent(rid).request(), 0.0) is None
        table.put(rid, TableEntry(sent(rid)))
    dispatched = {d.request_id: d.worker_id for d in core.schedule(0.0) if isinstance(d, Dispatch)}
    for rid, w in dispatched.items():
        table.put(rid, TableEntry(sent(rid)).on(w))
    running_lost = "lost" if "lost" in dispatched else next(iter(dispatched))
    report = (
        TableEntry(sent("new")).on("w1"),  # runs where the table does not say: taken in running
        TableEntry(sent(running_lost)),  # the table has it running, it says queued: dispatched again
    )
    sets: dict[str, TableEntry] = {}
    dels: set[str] = set()
    out: list[tuple[str, list[object]]] = []
    taken = take_census(core, table, lender, Census("c1", "a", report), 1.0, sets, dels, out)
    others = {"old", "lost", "queued"} - {running_lost}
    assert taken.dropped == len(others) and taken.adopted == 1 and taken.requeued == 0
    assert set(table.entries) == {"new", running_lost}
    assert dels == others
    assert table.entries["new"].running and "new" in core.workers["w1"].running
    assert len(out) == 1 and out[0][0] == "a"  # its dispatch, sent again
    assert not any(rid in w.running for w in core.workers.values() for rid in others)


def test_a_dead_homes_requests_are_cancelled_and_their_slots_held_until_the_engine_shows_them_gone() -> None:
    core, table, lender = Scheduler(SPECS), LiveTable(), Lender(SPECS, 0)
    for rid, home in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        assert (
            take_in(
                core, table, rid, TableEntry(sent(rid, home, est=3.0)).on("w0" if home == "a" else "w1"), 0.0
            )
            is None
        )
    sets: dict[str, TableEntry] = {}
    dels: set[str] = set()
    gone, held = cancel_dead(core, table, lender, {"a"}, 10.0, sets, dels)
    assert (gone, held) == (2, 2)
    assert set(table.entries) == {"b1"} and dels == {"a1", "a2"}
    quarantine = lender.quarantined()[("a", "w0")]
    assert quarantine.hold == 2 and quarantine.until == 10.0 + 2 * 3.0 + QUARANTINE_GRACE_S
    lender.hold_in(core)
    assert core.workers["w0"].free == 0  # (held for the dead home's requests, still at the engine)

    counts = {"w0": 2}

    async def engine_load(worker: str) -> int | None:
        return counts.get(worker)

    asyncio.run(release_quarantines(core, lender, engine_load, 11.0))
    assert ("a", "w0") in lender.quarantined()  # the engine still runs them
    counts["w0"] = 0
    asyncio.run(release_quarantines(core, lender, engine_load, 12.0))
    assert not lender.quarantined()
    lender.hold_in(core)
    assert core.workers["w0"].free == 2


def test_without_an_engine_count_a_quarantine_ends_at_its_time_limit() -> None:
    core, table, lender = Scheduler(SPECS), LiveTable(), Lender(SPECS, 0)
    lender.lend("a", "w1", 1)
    lender.hold_in(core)
    sets: dict[str, TableEntry] = {}
    assert cancel_dead(core, table, lender, {"a"}, 0.0, sets, set()) == (0, 1)
    assert lender.quarantined()[("a", "w1")].until == LENT_HOLD_S
    asyncio.run(release_quarantines(core, lender, None, LENT_HOLD_S - 0.1))
    assert lender.quarantined()
    asyncio.run(release_quarantines(core, lender, None, LENT_HOLD_S))
    assert not lender.quarantined()
