"""The one scheduler of a cluster: run by whichever replica holds the lease.

It reads every replica's events from ``PREFIX events`` (in order), applies
them to one :class:`~laneway.core.Scheduler`, and writes the decisions to the
stream of the replica that holds each request (``PREFIX dec:REPLICA``). With
each batch it also writes, in the same fenced Lua script (so only while it
holds the lease), the table of live requests (``PREFIX reqs``: home replica,
class, sizes, queued or running where) and how far it has read
(``PREFIX events:pos``). The table and the position always agree, so a
replica that takes the lease over rebuilds the core from the table —
queued requests in arrival order, running ones adopted on their workers — and
goes on from the position: nothing is applied twice or lost.

A replica that stops saying it lives (``PREFIX alive:REPLICA``) is taken for
dead: its requests are cancelled in the core, which frees their slots (their
HTTP streams to the upstreams died with it), and so are the slots lent to it.

Spare slots are lent to the replicas that ask (:mod:`laneway.cluster.lending`);
the loans are written with the rest (``PREFIX loans``), so that a new leader
holds them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio as aioredis

from laneway.cluster import tasks
from laneway.cluster.census import take_census, take_in
from laneway.cluster.codec import (
    Availability,
    BadMessage,
    CachedOn,
    CacheLost,
    CacheSpace,
    Cancelled,
    Census,
    CensusAsked,
    Finished,
    FirstToken,
    LoanTaken,
    Pace,
    Preempted,
    Progress,
    Requeued,
    SlotCap,
    SlotsWanted,
    Submitted,
    TableEntry,
    decode_event,
    encode,
)
from laneway.cluster.commit import COMMIT, commit_args
from laneway.cluster.dead_homes import cancel_dead, release_quarantines
from laneway.cluster.fleet_book import FLEET_EVENTS, FleetBook
from laneway.cluster.leader_figures import estimates
from laneway.cluster.lease import Lease, NotLeader
from laneway.cluster.lending import Lender
from laneway.cluster.liveness import ALIVE_TTL_S, DEAD_TTL_S, REAP
from laneway.cluster.redis_io import stream_entries, text, text_map
from laneway.cluster.relay import Relay
from laneway.cluster.remote import ESTIMATES_EVERY_S
from laneway.cluster.table import LiveTable
from laneway.core import (
    InvalidTransition,
    LanewayError,
    Scheduler,
    UnknownRequest,
    WorkerSpec,
)
from laneway.core.config import SchedulerConfig
from laneway.core.decisions import apply
from laneway.logs import Repeated
from laneway.runtime import fleet_view
from laneway.runtime.sizing import Sizing

log = logging.getLogger("laneway.cluster")

READ_COUNT = 8  # stream entries (of up to 64 events each) applied per commit (bounded: the
# changes they make become script arguments)
IDLE_BLOCK_MS = 200
REAP_EVERY_S = 1.0
GAP_S = 1.0  # a read of events that took this much longer than it blocks: Redis stood still
QUARANTINE_CHECK_S = 0.5  # how often the engines of slots held for dead replicas are asked
CENSUS_WAIT_S = 3.0  # a new leader waits this long at most for every replica's census
# ... and this long at least: a replica tells each new leader it sees at its next heartbeat
# (one a liveness / 3), so every live one has been heard by then, even one the leader could
# not know of (Redis came back empty: no table, no heartbeat keys yet)
CENSUS_MIN_S = 1.3


class Leader:
    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        replica: str,
        home: str,
        specs: Sequence[WorkerSpec],
        config: SchedulerConfig,
        policy: str,
        models: Sequence[str],
        deliver: Callable[[list[list[Any]]], None],
        *,
        lend_reserve: int = 1,
        lending: bool = False,
        fleet: FleetBook | None = None,
    ) -> None:
        self.r = client
        self.fleet = fleet  # (a GPU fleet's: its core places models on the nodes' GPUs)
        self.p = prefix
        self.replica = replica
        self.me = home  # this process's home id (its requests are delivered without Redis)
        self.specs = list(specs)
        self.config = config
        self.policy = policy
        self.models = list(models)
        self.deliver = deliver  # what is for this replica's own requests (encoded)
        self.lending = lending  # (whether replicas ask for slots at all)
        self.lender = Lender(self.specs, lend_reserve)
        self.serves = {w.id: set(w.models or ()) for w in self.specs}
        self.core: Scheduler | None = None
        self.lease: Lease | None = None
        self._task: asyncio.Task[None] | None = None
        self._commit: Callable[..., Any] | None = None
        self.table = LiveTable()  # the live requests: as sent, queued or running where, and their homes
        self.pos = "0-0"
        self.applied: dict[str, int] = {}  # home -> the last of its event entries applied
        # homes taken for dead (their tombstones): what they send after that is not applied (one
        # that wakes from a pause answers a census, or submits, before it learns it is dead)
        self.dead: set[str] = set()
        self.reaping: set[str] = set()
        self.healthy_since = math.inf  # (time.time) since when Redis answered without a gap
        self.led = 0  # times this replica became leader
        self.pace = Sizing(config.costs, 0)  # decode speed per model, as the replicas measure it
        # the requests a worker's engine runs or queues by its own count (None: it gives none)
        self.engine_load: Callable[[str], Awaitable[int | None]] | None = None
        self.census_pending: set[str] = set()  # replicas asked what they run, not answered yet
        self.census_from = 0.0  # nothing is dispatched before (every live replica heard by then)
        self.census_until = 0.0  # nor after, unless every replica asked answered
        # (while Redis is away the loop retries several times a second: a warning every 10 s)
        self._reads, self._reaps, self._writes = Repeated(log), Repeated(log), Repeated(log)

    # ------------------------------------------------------------------ the lease
    def use(self, lease: Lease) -> None:
        self.lease = lease
        self._commit = lease.fenced(COMMIT)
        self._reap_script = lease.fenced(REAP)

    async def lead(self, token: str) -> None:
        await self._rebuild()
        await self._ask_census(token)
        self.led += 1
        self._task = asyncio.get_running_loop().create_task(self._guarded())

    async def _alive(self) -> set[str]:
        """The homes whose liveness has not expired."""
        return {
            text(key).removeprefix(self.p + "alive:")
            async for key in self.r.scan_iter(match=self.p + "alive:*", count=1000)
        }

    async def _ask_census(self, census_id: str) -> None:
        """Ask every replica that lives or has requests in the table what its requests do now
        (:meth:`_census`): what Redis held may lack what was written last (or all of it).
        Nothing is dispatched until every one of them answered, or :data:`CENSUS_WAIT_S`
        passed. (A replica also tells each new leader it sees in the lease, unasked: one whose
        heartbeat had not come back yet when the leader looked is heard all the same.)"""
        homes = {self.me, *self.table.home.values(), *self.lender.homes(), *await self._alive()}
        self.census_pending = set(homes)
        self.census_from = time.time() + CENSUS_MIN_S
        self.census_until = time.time() + CENSUS_WAIT_S
        await self._write([], [], [(h, encode(CensusAsked(census_id))) for h in sorted(homes)])

    async def _guarded(self) -> None:
        """The loop; if it breaks, the lease is given up (another replica, or this one once
        it tries again, rebuilds from Redis) rather than held by a leader that decides nothing."""
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("leader %s failed; giving up the lease", self.replica)
            self.core = None
            if self.lease is not None:
                with contextlib.suppress(Exception):
                    await self.lease.release()

    async def lose(self) -> None:
        await tasks.stop(self._task)
        self._task = None
        self.core = None

    @property
    def leading(self) -> bool:
        return self.core is not None

    # ------------------------------------------------------------------ rebuild
    async def _rebuild(self) -> None:
        now = time.time()
        if self.fleet is not None:  # (its engines that run are taken in before the requests on them)
            core = self.fleet.core()
            await self.fleet.adopt(self.r, self.p, core, await self._alive(), now)
        else:
            core = Scheduler(self.specs, self.config, self.policy)
        raw = text_map(await self.r.hgetall(self.p + "reqs"))
        loans = text_map(await self.r.hgetall(self.p + "loans"))
        applied = text_map(await self.r.hgetall(self.p + "applied"))
        pos = await self.r.get(self.p + "events:pos")
        self.pos = text(pos) if pos is not None else "0-0"
        self.applied = {k: int(v) for k, v in applied.items()}
        self.dead = set()
        async for key in self.r.scan_iter(match=self.p + "dead:*", count=1000):
            self.dead.add(text(key).removeprefix(self.p + "dead:"))
        # taken for dead by a leader before, whose commit of their quarantine never came:
        # taken for dead again (their quarantine is written with the next commit)
        self.reaping = {text(h) for h in await self.r.smembers(self.p + "reaping")}
        self.healthy_since = time.time()  # (a new leader gives every replica a period to say it lives)
        self.table.clear()
        pending: list[tuple[str, list[Any]]] = []
        refused_ids: list[str] = []
        rows = sorted(
            ((k, TableEntry.from_json(json.loads(v))) for k, v in raw.items()),
            key=lambda kv: kv[1].sent.arrival_s,
        )
        adopted = queued = 0
        for rid, entry in rows:
            refused = take_in(core, self.table, rid, entry, now)
            if refused is not None:
                pending.append((entry.sent.home, encode(refused)))
                refused_ids.append(rid)
            elif self.table.entries[rid].running:
                adopted += 1
            else:
                queued += 1
        self.lender.restore({k: json.loads(v) for k, v in loans.items()}, core.workers)
        for w, lent, held in self.lender.hold_in(core):
            log.warning("worker %s: %d slots lent, only %d free to hold", w, lent, held)
        self.core = core
        log.info(
            "replica %s leads: %d requests running, %d queued, events from %s",
            self.replica,
            adopted,
            queued,
            self.pos,
        )
        if pending:
            await self._write([], refused_ids, pending)

    def _lend(self, core: Scheduler, out: list[tuple[str, list[Any]]]) -> None:
        """Lend spare slots to the replicas that asked, or call every loan back while
        something waits; the core holds what is lent."""
        lender = self.lender
        if self.lending or lender.loans:
            down = core.placement.down
            free = {w: s.free for w, s in core.workers.items()}
            lent = lender.plan(free, lender.asking(time.time()), core.queued > 0, down, self.serves)
            lender.answered(lent)
            out += [(home, encode(m)) for home, m in lent]
        lender.hold_in(core)

    # ------------------------------------------------------------------ the loop
    async def _run(self) -> None:
        last_reap = last_est = last_quarantine = 0.0
        while True:
            core = self.core
            assert core is not None
            now = t_read = time.time()
            wake = core.next_wakeup()
            block = (
                IDLE_BLOCK_MS if wake == math.inf else int(min(IDLE_BLOCK_MS, max(1.0, (wake - now) * 1000)))
            )
            try:
                got = await self.r.xread({self.p + "events": self.pos}, count=READ_COUNT, block=block)
            except (aioredis.RedisError, OSError) as exc:
                self._reads.warn("leader %s: cannot read events: %s", self.replica, exc)
                self.healthy_since = math.inf
                await asyncio.sleep(0.2)
                continue
            self._reads.ok("leader %s: reads events again", self.replica)
            now = time.time()
            if now - t_read > block / 1000 + GAP_S:  # Redis stood still: a gap
                self.healthy_since = now
            self.healthy_since = min(self.healthy_since, now)
            sets: dict[str, TableEntry] = {}
            dels: set[str] = set()
            out: list[tuple[str, list[Any]]] = []
            applied: dict[str, int] = {}
            moved = False
            for entry_id, fields in stream_entries(got):
                self.pos = entry_id
                moved = True
                home = text(fields.get(b"h", b""))
                if home in self.dead:
                    continue  # (it learns it was taken for dead and goes on under a new name)
                n = int(fields.get(b"n", 0))
                if home and n:
                    if n <= self.applied.get(home, 0):
                        continue  # (sent again: its answer had been lost)
                    self.applied[home] = applied[home] = n
                for e in json.loads(fields[b"b"]):
                    try:
                        event = decode_event(e)
                    except BadMessage as exc:
                        log.warning("leader %s: an event of %s not applied: %s", self.replica, home, exc)
                        continue
                    self._apply(event, now, sets, dels, out)
            self.lender.hold_in(core)  # (loans that came back: their slots are the core's again)
            if self.fleet is not None and self.fleet.orphaned:
                self.fleet.settle(core, now)
            if self.census_pending and now >= self.census_until:
                log.warning(
                    "leader %s: no census from %s; scheduling on what Redis holds of them",
                    self.replica,
                    ", ".join(sorted(self.census_pending)),
                )
                self.census_pending = set()
            if not self.census_pending and now >= self.census_from:
                apply(core.schedule(now), Relay(self, sets, dels, out), now)
            unapplied: list[str] = []
            if now - last_reap >= REAP_EVERY_S and now - self.healthy_since >= ALIVE_TTL_S:
                last_reap = now
                try:
                    unapplied = await self._reap(now, sets, dels, out)
                except NotLeader:
                    log.warning("leader %s was fenced off: another replica leads", self.replica)
                    self.core = None
                    return
                except (aioredis.RedisError, OSError) as exc:
                    self._reaps.warn("leader %s: cannot look for dead replicas: %s", self.replica, exc)
            if now - last_quarantine >= QUARANTINE_CHECK_S and self.lender.quarantined():
                last_quarantine = now
                await release_quarantines(core, self.lender, self.engine_load, now)
            if not self.census_pending and now >= self.census_from:
                self._lend(core, out)
            if moved or sets or dels or out or self.lender.changed or unapplied:
                changed = [(rid, self.table.entries[rid]) for rid in sets if rid in self.table.entries]
                while True:  # the core has moved on: this must be written (or the lease is lost)
                    try:
                        await self._write(changed, dels, out, applied, unapplied)
                        self._writes.ok("leader %s: writes its decisions again", self.replica)
                        break
                    except NotLeader:
                        log.warning("leader %s was fenced off: another replica leads", self.replica)
                        self.core = None
                        return
                    except (aioredis.RedisError, OSError) as exc:
                        self._writes.warn("leader %s: cannot write its decisions: %s", self.replica, exc)
                        await asyncio.sleep(0.1)
            if now - last_est >= ESTIMATES_EVERY_S:
                last_est = now
                await self._publish(now)

    def _apply(
        self,
        e: Any,
        now: float,
        sets: dict[str, TableEntry],
        dels: set[str],
        out: list[tuple[str, list[Any]]],
    ) -> None:
        core = self.core
        assert core is not None
        kind = type(e)
        try:
            if kind is Submitted:
                sent = e.sent
                rid = sent.id
                if rid in self.table.entries:
                    return  # (sent twice)
                refused = self.fleet.refusal(rid, sent.model, now) if self.fleet is not None else None
                refused = refused or core.submit(sent.request(), now)
                if refused is not None:
                    out.append((sent.home, encode(refused)))
                    return
                self.table.put(rid, TableEntry(sent), sets, dels)
            elif kind is Finished:
                try:
                    core.finished(
                        e.request_id, now, failed=e.failed, tokens=e.tokens, prompt_tokens=e.prompt_tokens
                    )
                except InvalidTransition:  # (queued again by a rebuild, its worker gone: it ended)
                    core.cancel(e.request_id, now, tokens=e.tokens)
                finally:
                    self.table.forget(e.request_id, sets, dels)
            elif kind is Cancelled:
                try:
                    core.cancel(e.request_id, now, tokens=e.tokens)
                finally:
                    self.table.forget(e.request_id, sets, dels)
            elif kind is Preempted:
                try:
                    core.preempted(
                        e.request_id,
                        now,
                        tokens_done=e.tokens_done,
                        checkpoint_bytes=e.checkpoint_bytes,
                        save_s=e.save_s,
                    )
                except InvalidTransition:  # preempted by a leader before this one: it runs here
                    core.requeue(e.request_id, now)
                self.table.queued(e.request_id, sets)
            elif kind is Requeued:
                core.requeue(e.request_id, now, failed=e.failed)
                self.table.queued(e.request_id, sets)
            elif kind is Progress:
                core.progress(e.request_id, e.tokens, now)
            elif kind is FirstToken:
                core.first_token(e.request_id, now)
            elif kind is Availability:
                core.set_available(e.worker, e.available)
            elif kind is CacheSpace:
                core.set_kv_tokens(e.worker, e.kv_tokens)
            elif kind is CacheLost:
                core.cache_lost(e.worker)
            elif kind is SlotCap:
                core.set_slots(e.worker, e.slots)
            elif kind is CachedOn:  # a replica started a prompt on a lent slot
                core.cached_on(e.worker, e.prefix)
            elif kind is Pace:  # a replica measured the pace of a model
                self.pace.observe(e.model, e.tokens, e.seconds)
            elif kind is SlotsWanted:  # a replica asks for slots for a model
                self.lender.ask(e.home, e.model, now)
            elif kind is LoanTaken:  # a replica took a loan's new figure
                self.lender.report(e.home, e.worker, e.seq, e.used)
            elif kind is Census:  # a replica's census: its requests now
                self.census_pending.discard(e.home)
                taken = take_census(core, self.table, self.lender, e, now, sets, dels, out)
                if taken.dropped or taken.adopted or taken.requeued:
                    log.warning(
                        "leader %s: census of %s: %d requests ended unreported, %d taken in running, "
                        "%d queued",
                        self.replica,
                        e.home,
                        taken.dropped,
                        taken.adopted,
                        taken.requeued,
                    )
            elif kind in FLEET_EVENTS and self.fleet is not None:  # an owner's engines
                decided = self.fleet.apply(e, core, now, out, self.table.queued_of)
                apply(decided, Relay(self, sets, dels, out), now)
        except (UnknownRequest, InvalidTransition, LanewayError, KeyError):
            pass  # (an end of what ended before, a request this leader does not know)

    async def _reap(
        self, now: float, sets: dict[str, TableEntry], dels: set[str], out: list[tuple[str, list[Any]]]
    ) -> list[str]:
        """Cancel the requests of replicas that stopped saying they live (each taken for dead
        in one script with its tombstone: :mod:`laneway.cluster.liveness`); the homes whose
        event numbers are forgotten."""
        engines = set(self.fleet.started_by.values()) if self.fleet is not None else set()
        homes = sorted(
            (set(self.table.home.values()) | self.lender.homes() | set(self.applied) | self.reaping | engines)
            - {self.me}
        )
        if not homes:
            return []
        dead = {
            h.decode() if isinstance(h, bytes) else h
            for h in await self._reap_script([], [self.p, DEAD_TTL_S, *homes])
        }
        if not dead:
            return []
        self.dead |= dead
        self.reaping -= dead
        if self.fleet is not None and self.core is not None:
            self.fleet.dead(dead, self.core)
        for h in dead:
            self.applied.pop(h, None)
        core = self.core
        assert core is not None
        gone, held = cancel_dead(core, self.table, self.lender, dead, now, sets, dels)
        if not gone and not held:
            return sorted(dead)  # (taken for dead before: late events of it named it again)
        log.warning(
            "replicas %s are gone: %d of their requests cancelled; %d slots held until their "
            "engines show them ended",
            ", ".join(sorted(dead)),
            gone,
            held,
        )
        return sorted(dead)

    async def _write(
        self,
        sets: Sequence[tuple[str, TableEntry]],
        dels: Sequence[str] | set[str],
        out: Sequence[tuple[str, list[Any]]],
        applied: dict[str, int] | None = None,
        unapplied: Sequence[str] = (),
    ) -> None:
        assert self._commit is not None
        args = commit_args(self.p, self.pos, sets, dels, out, self.me, self.lender, applied, unapplied)
        keys = [self.p + "reqs", self.p + "events:pos", self.p + "loans", self.p + "applied"]
        await self._commit(keys, args)
        self.lender.changed = set()
        mine = [e for h, e in out if h == self.me]
        if mine:
            self.deliver(mine)

    async def _publish(self, now: float) -> None:
        core = self.core
        assert core is not None
        fig = estimates(core, self.models, now)
        fig["leader"] = self.replica
        fig["pace"] = self.pace.decode_tokens_s
        if self.fleet is not None and self.fleet.planner is not None:  # (its engines, where placed)
            planner = self.fleet.planner
            fig["fleet"] = fleet_view.placed(
                planner, now, lambda rid: planner.replicas[rid].ready and rid not in planner.down
            )
            self.fleet.failing = {m: f for m, f in self.fleet.failing.items() if f[1] > now}
            fig["failing"] = self.fleet.failing
        with contextlib.suppress(aioredis.RedisError, OSError):
            await self.r.set(self.p + "est", json.dumps(fig), px=5000)
            await self.r.xtrim(self.p + "events", minid=self.pos)
