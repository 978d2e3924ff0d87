"""The lease and its fencing token, model-checked against a real Redis: whatever the
interleaving of acquisitions, renewals, expiries, stale leaders and Redis losing all
its data, a write is accepted only from the holder of the lease with the latest token, so
two leaders never both write."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laneway.bus import connect
from laneway.cluster.lease import Campaign, Lease, NotLeader

NAMES = ("a", "b", "c")
op = st.one_of(
    st.tuples(st.just("acquire"), st.sampled_from(NAMES)),
    st.tuples(st.just("renew"), st.sampled_from(NAMES)),
    st.tuples(st.just("write"), st.sampled_from(NAMES)),
    st.tuples(st.just("release"), st.sampled_from(NAMES)),
    st.tuples(st.just("expire"), st.just("")),  # the holder stalls past its lease
    st.tuples(st.just("wipe"), st.just("")),  # Redis restarts empty: a new generation is made
)
WRITE = "redis.call('RPUSH', KEYS[1], ARGV[1]) return redis.call('LLEN', KEYS[1])"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(op, max_size=40))
def test_only_the_latest_holder_writes(bus_url: str, ops: list[tuple[str, str]]) -> None:
    async def run() -> None:
        prefix = f"lease:{uuid.uuid4().hex[:8]}:"
        client = connect(bus_url)
        try:
            leases = {n: Lease(client, prefix, n, ttl_s=30) for n in NAMES}
            writes = {n: leases[n].fenced(WRITE) for n in NAMES}
            # the model: the latest token given out (the generation and the epoch), whether
            # the lease is held, and every token superseded
            gen, epoch = "", 0
            latest: str | None = None
            retired: set[str] = set()
            held_by: str | None = None
            accepted: list[tuple[str, str]] = []
            for name, who in ops:
                lease = leases.get(who)
                if name == "acquire":
                    token = await lease.acquire()  # type: ignore[union-attr]
                    if held_by is None:
                        epoch += 1
                        if latest is not None:
                            retired.add(latest)
                        latest = f"{gen}:{epoch}"
                        assert token == latest
                        held_by = who
                    else:
                        assert token is None
                elif name == "renew":
                    ok = await lease.renew()  # type: ignore[union-attr]
                    assert ok == (held_by == who and lease.token == latest)  # type: ignore[union-attr]
                elif name == "release":
                    mine = held_by == who and lease.token == latest  # type: ignore[union-attr]
                    await lease.release()  # type: ignore[union-attr]
                    if mine:
                        held_by = None
                elif name == "expire":
                    await client.delete(prefix + "leader")
                    held_by = None  # (its holder may still believe it leads)
                elif name == "wipe":  # everything gone; the generation check makes a new one
                    for key in await client.keys(prefix + "*"):
                        if not key.endswith(b":log"):
                            await client.delete(key)
                    gen, epoch, held_by = uuid.uuid4().hex[:8], 0, None
                    await client.set(prefix + "gen", gen)
                    if latest is not None:
                        retired.add(latest)
                    latest = None
                else:
                    token = lease.token  # type: ignore[union-attr]
                    valid = held_by == who and token == latest  # (the lease holds its name and token)
                    try:
                        await writes[who]([prefix + "log"], [f"{who}:{token}"])
                    except NotLeader:
                        assert not valid  # refused: a stale token, or a lease run out
                    else:
                        assert valid  # accepted: only the holder of the lease, with the latest token
                        assert token not in retired  # (a token of before a wipe never again)
                        accepted.append((who, token))
            logged = [x.decode() for x in await client.lrange(prefix + "log", 0, -1)]
            assert logged == [f"{w}:{t}" for w, t in accepted]
        finally:
            await client.aclose()

    asyncio.run(run())


def test_a_standby_leads_within_the_lease_after_the_leader_stops_renewing(bus_url: str) -> None:
    async def run() -> None:
        prefix = f"campaign:{uuid.uuid4().hex[:8]}:"
        client = connect(bus_url)
        events: list[tuple[str, str, float]] = []
        loop = asyncio.get_running_loop()

        def campaign(name: str) -> Campaign:
            async def lead(token: str) -> None:
                events.append(("lead", name, loop.time()))

            async def lose() -> None:
                events.append(("lose", name, loop.time()))

            return Campaign(Lease(client, prefix, name, ttl_s=0.6), lead, lose, every_s=0.1)

        try:
            a, b = campaign("a"), campaign("b")
            a.start()
            await asyncio.sleep(0.3)
            b.start()
            await asyncio.sleep(0.5)
            assert [e[:2] for e in events] == [("lead", "a")]
            assert a._task is not None
            a._task.cancel()  # "a" dies: it stops renewing, without releasing
            died = loop.time()
            for _ in range(40):
                if any(e[:2] == ("lead", "b") for e in events):
                    break
                await asyncio.sleep(0.05)
            led = next(t for kind, name, t in events if (kind, name) == ("lead", "b"))
            assert led - died < 0.6 + 0.3  # the lease, plus one try
            with pytest.raises(NotLeader):
                await a.lease.fenced(WRITE)([prefix + "log"], ["late"])  # the old leader is fenced off
            await b.close()
        finally:
            await client.aclose()

    asyncio.run(run())


def test_a_replica_of_a_higher_priority_takes_the_lease_and_others_take_over_when_it_dies(
    bus_url: str,
) -> None:
    """``leader_priority``: a live candidate that outranks the holder gets the lease handed
    over (the old holder's writes are fenced off); while it lives nobody else takes the
    lease; once it stops trying, a lower one leads within the lease."""

    async def run() -> None:
        prefix = f"prio:{uuid.uuid4().hex[:8]}:"
        client = connect(bus_url)
        loop = asyncio.get_running_loop()
        leads: list[tuple[str, float]] = []
        loses: list[str] = []

        def campaign(name: str, priority: int) -> Campaign:
            async def lead(token: str) -> None:
                leads.append((name, loop.time()))

            async def lose() -> None:
                loses.append(name)

            lease = Lease(client, prefix, name, ttl_s=0.6, priority=priority)
            return Campaign(lease, lead, lose, every_s=0.1)

        try:
            a, b, s = campaign("a", 1), campaign("b", 1), campaign("s", 5)
            a.start()
            await asyncio.sleep(0.2)
            b.start()
            await asyncio.sleep(0.3)
            assert [n for n, _ in leads] == ["a"]  # (equal priorities: the first to try)
            s.start()
            await asyncio.sleep(0.6)
            assert [n for n, _ in leads] == ["a", "s"] and loses == ["a"]  # handed over
            with pytest.raises(NotLeader):
                await a.lease.fenced(WRITE)([prefix + "log"], ["old"])
            await asyncio.sleep(0.8)  # several lease periods: it stays with "s"
            assert [n for n, _ in leads] == ["a", "s"]
            assert s._task is not None
            s._task.cancel()  # "s" dies: no renewal, no release
            died = loop.time()
            for _ in range(40):
                if len(leads) > 2:
                    break
                await asyncio.sleep(0.05)
            assert len(leads) == 3 and leads[2][0] in ("a", "b")
            assert leads[2][1] - died < 0.6 + 0.3  # the lease (and the candidacy), plus one try
            await a.close()
            await b.close()
        finally:
            await client.aclose()

    asyncio.run(run())
