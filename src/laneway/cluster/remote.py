"""The scheduler as a replica's runtime sees it when another process may lead.

:class:`RemoteScheduler` stands where the runtime's :class:`~laneway.core.Scheduler`
stands in a single process, with the methods the runtime calls. Each call
becomes an event on the Redis stream ``PREFIX events`` (sent in order, in
pipelined batches, by one task: :mod:`laneway.cluster.outbox`); the leader
(:mod:`laneway.cluster.leader`), wherever it runs, applies them to the one core and sends back the decisions
for this replica's requests on ``PREFIX dec:REPLICA``, which :meth:`schedule`
hands to the runtime. Admission is the leader's too: a refused request gets
its :class:`~laneway.core.Reject` as a decision, a moment later.

Estimates come from the figures the leader publishes (``PREFIX est``) a few
times a second.

A short request may start at once instead, on a slot the leader lent this
replica (:mod:`laneway.cluster.lending`): then the leader hears nothing of it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis

from laneway.cluster import tasks
from laneway.cluster.codec import (
    RUNNING,
    Availability,
    BadMessage,
    CachedOn,
    CacheLost,
    CacheSpace,
    Cancelled,
    Census,
    CensusAsked,
    Event,
    Finished,
    FirstToken,
    LoanGranted,
    Owns,
    Preempted,
    Progress,
    Requeued,
    Sent,
    SlotCap,
    SlotsWanted,
    Submitted,
    TableEntry,
    decode_order,
)
from laneway.cluster.dispatch_gate import DispatchGate
from laneway.cluster.leader_figures import LeaderFigures
from laneway.cluster.lending import Borrower, starts_itself
from laneway.cluster.liveness import ALIVE_TTL_S, HEARTBEAT
from laneway.cluster.local_deadlines import LocalDeadlines
from laneway.cluster.outbox import Outbox
from laneway.cluster.redis_io import stream_entries
from laneway.cluster.shared_sizing import SharedSizing
from laneway.core import Decision, Dispatch, Preempt, Reject, Request, Scheduler, WaitRange, WorkerSpec
from laneway.core.admission import Admission
from laneway.core.config import SchedulerConfig
from laneway.core.prefix_cache import PrefixIndex
from laneway.core.stats import Snapshot
from laneway.logs import Repeated
from laneway.runtime.sizing import Sizing

log = logging.getLogger("laneway.cluster")

ESTIMATES_EVERY_S = 0.25  # how often the leader publishes estimates (and a replica reads them)


class RemoteScheduler:
    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        replica: str,
        class_names: tuple[str, ...],
        kick: Callable[[], None],
        *,
        specs: Sequence[WorkerSpec] = (),
        config: SchedulerConfig | None = None,
        lend_max_s: float = 0.0,
    ) -> None:
        self.r = client
        self.p = prefix
        self.replica = replica
        # this process's name in events, decisions and liveness: a replica that restarts under
        # the same name is a new one (what the old one left running is the old one's)
        self.home = f"{replica}.{uuid.uuid4().hex[:8]}"
        self.names = class_names
        self.kick = kick
        self.events_key = prefix + "events"
        self.decisions_key = f"{prefix}dec:{self.home}"
        self.outbox = Outbox(client, self.events_key, self.home, replica)
        self._reads = Repeated(log)  # (while Redis is away: a warning every 10 s, not each retry)
        self._inbox: list[Decision] = []
        self._mine: set[str] = set()  # live requests of this replica
        self._reqs: dict[str, Request] = {}  # their requests as sent (for a census)
        self._censused: set[str] = set()  # the census this replica answered (a leader's token)
        # (the node says) what this replica's requests do now: (id, worker or None: queued)
        self.running_now: Callable[[], list[tuple[str, str | None]]] = list
        # (the node says) the leader's core where this replica leads, else None: its quotas
        self.leading_core: Callable[[], Scheduler | None] = lambda: None
        self.figures = LeaderFigures()  # (what the leader publishes: estimates, counts, ...)
        self._tasks: list[asyncio.Task[None]] = []
        self.sizing: SharedSizing | None = None  # (set by the node: the runtime's sizing)
        cfg = config or SchedulerConfig()
        # slots the leader lent, and what runs on them; where this replica's prompts likely are
        index = PrefixIndex({w.id: w.kv_tokens for w in specs}) if cfg.placement == "prefix" else None
        self.borrower = Borrower(list(specs), index=index)
        self.lend_max_s = lend_max_s
        self.on_lent_start: Callable[[], None] = lambda: None  # (the node counts them in metrics)
        # (the node ends the requests it had in flight): its new name, their ids
        self.on_reborn: Callable[[str, list[str]], None] = lambda home, ids: None
        self._last = "0-0"  # the last decision read
        self._tenants = Admission(cfg.tenants, cfg.default_tenant, class_names)
        self._timeouts = [c.timeout_s for c in cfg.classes.classes]
        self._deadlines = LocalDeadlines()  # (requests sent to the leader: when given up on here)
        self.last_heartbeat = -math.inf  # (monotonic) the last heartbeat that got through
        # dispatches that came while this replica could have been taken for dead (a pause past
        # its liveness): started only once a heartbeat says it was not
        self._held: list[Decision] = []
        # a fleet's (laneway.cluster.fleet_replica): the node whose engines this replica starts;
        # the decisions held (in order) while the worker of a dispatch among them is made
        self.node: str | None = None
        self.gate: DispatchGate | None = None
        # (the node hears) which engines the leader places on, and the models it cannot start
        self.on_engines: Callable[[set[str]], None] = lambda ids: None
        self.on_failing: Callable[[dict[str, tuple[str, float]]], None] = lambda failing: None
        self.on_fleet: Callable[[dict[str, Any]], None] = lambda view: None  # (where the leader placed what)

    def share(self, sizing: Sizing) -> SharedSizing:
        """``sizing`` as a replica of the cluster measures: with every replica's pace."""
        self.sizing = SharedSizing(sizing, self._emit)
        return self.sizing

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._heartbeat_script = self.r.register_script(HEARTBEAT)
        await self.r.set(f"{self.p}alive:{self.home}", "1", px=int(ALIVE_TTL_S * 1000))
        self.last_heartbeat = time.monotonic()
        self._owns()
        start_id = "0-0"  # (a stream of this process's own)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self.outbox.run()),
            loop.create_task(self._receive(start_id)),
            loop.create_task(self._heartbeat()),
        ]

    async def close(self) -> None:
        if self.gate is not None:
            await self.gate.close()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            await tasks.stop(t)
        await self.outbox.drain()

    # ------------------------------------------------------------------ the core's surface
    def _emit(self, event: Event) -> None:
        self.outbox.put(event)

    emit = _emit  # (what a fleet's engines tell the leader goes with the other events, in order)

    def _owns(self) -> None:
        if self.node is not None:
            self._emit(Owns(self.node, self.home))

    def submit(self, req: Request, now: float) -> Reject | None:
        req.arrival_s = time.time()  # (the cluster's clock: every replica's wall clock)
        self._mine.add(req.id)
        self._reqs[req.id] = req
        if self._may_start(req):
            worker = self.borrower.take(req, time.monotonic())
            if worker is not None:  # on a lent slot: at once, and the leader hears nothing
                self._inbox.append(Dispatch(req.id, worker, None))  # (but where its prompt is)
                if req.prefix and self.borrower.index is not None:
                    self._emit(CachedOn(worker, req.prefix))
                self.on_lent_start()
                return None
            self._emit(SlotsWanted(self.home, req.model or ""))  # (it asks for slots)
        self._emit(Submitted(Sent.of(req, self.home)))
        self._arm(req, now)
        return None  # admitted or refused by the leader: a decision comes back

    def _arm(self, req: Request, now: float, *, back: bool = False) -> None:
        """Give ``req`` up here if no decision for it comes by its queue timeout (and a grace):
        the leader could not be reached. ``back``: it started before, and is given up on only
        while the cluster is out of reach."""
        limit = req.timeout_s if req.timeout_s is not None else self._timeouts[req.priority]
        self._deadlines.arm(req.id, limit, now, back=back)

    def _rearm(self, request_id: str, now: float) -> None:
        req = self._reqs.get(request_id)
        if req is not None and request_id in self._mine:
            self._arm(req, now, back=True)

    def _may_start(self, req: Request) -> bool:
        est = req.est_service_s
        return (
            est is not None
            and est <= self.lend_max_s
            and not req.depends_on
            and starts_itself(self._tenants.policy_for(req.tenant), req.priority)
        )

    def _gave_back(self, request_id: str) -> Request | None:
        """``request_id`` left a lent slot (if it ran on one): that request."""
        b, report = self.borrower.give_back(self.home, request_id)
        if report is not None:
            self._emit(report)
        return None if b is None else b.req

    def finished(
        self,
        request_id: str,
        now: float,
        *,
        failed: bool = False,
        tokens: int | None = None,
        prompt_tokens: int | None = None,
    ) -> None:
        self._mine.discard(request_id)
        self._reqs.pop(request_id, None)
        self._deadlines.drop(request_id)
        if self._gave_back(request_id) is None:
            self._emit(Finished(request_id, failed, tokens, prompt_tokens))

    def preempted(
        self,
        request_id: str,
        now: float,
        *,
        tokens_done: int | None = None,
        checkpoint_bytes: int | None = None,
        save_s: float | None = None,
    ) -> None:
        self._rearm(request_id, now)
        req = self._gave_back(request_id)
        if req is not None:  # (stopped on a lent slot: it waits in the leader's queues now)
            self._emit(Submitted(Sent.of(req, self.home)))
            return
        self._emit(Preempted(request_id, tokens_done, checkpoint_bytes, save_s))

    def cancel(self, request_id: str, now: float, *, tokens: int | None = None) -> bool:
        live = request_id in self._mine
        self._mine.discard(request_id)
        self._reqs.pop(request_id, None)
        self._deadlines.drop(request_id)
        if self._gave_back(request_id) is None:
            self._emit(Cancelled(request_id, tokens))
        return live

    def requeue(self, request_id: str, now: float, *, failed: bool = False) -> None:
        self._rearm(request_id, now)
        req = self._gave_back(request_id)
        self._emit(Requeued(request_id, failed) if req is None else Submitted(Sent.of(req, self.home)))

    def progress(self, request_id: str, tokens: int, now: float) -> None:
        if request_id not in self.borrower.running:
            self._emit(Progress(request_id, tokens))

    def first_token(self, request_id: str, now: float) -> bool:
        if request_id not in self.borrower.running:
            self._emit(FirstToken(request_id))
        return False  # (the leader's core steps on the events it applies)

    def set_available(self, worker_id: str, available: bool) -> None:
        if available:
            self.borrower.down.discard(worker_id)
        else:
            self.borrower.down.add(worker_id)
        self._emit(Availability(worker_id, available))

    def set_kv_tokens(self, worker_id: str, tokens: int) -> None:
        if self.borrower.index is not None:
            self.borrower.index.set_capacity(worker_id, tokens)
        self._emit(CacheSpace(worker_id, tokens))

    def set_slots(self, worker_id: str, n: int) -> None:
        self._emit(SlotCap(worker_id, n))

    def cache_lost(self, worker_id: str) -> None:
        if self.borrower.index is not None and worker_id in self.borrower.index:
            self.borrower.index.forget(worker_id)
        self._emit(CacheLost(worker_id))

    def withdraw(
        self, request_id: str, now: float, reason: str, message: str, retry_after_s: float
    ) -> Reject:
        """Refused here (no worker of its model is up): the leader forgets it."""
        self.cancel(request_id, now)
        return Reject(request_id, reason, message, retry_after_s, retry_after_s)

    def deliver(self, entries: list[list[Any]]) -> None:
        """What the leader sends this replica (decisions, loans), encoded; the leader
        running in this very process calls it without a round trip."""
        for e in entries:
            try:
                d = decode_order(e)
            except BadMessage as exc:
                log.warning("replica %s: an order not applied: %s", self.replica, exc)
                continue
            if isinstance(d, LoanGranted):  # slots lent
                self._emit(self.borrower.granted(self.home, d.worker, d.slots, d.seq))
                continue
            if isinstance(d, CensusAsked):  # a new leader asks what this replica's requests do
                self._census(d.census_id)
                continue
            if type(d) is Reject:
                self._mine.discard(d.request_id)
                self._reqs.pop(d.request_id, None)
            elif type(d) is Dispatch and self.borrower.index is not None:  # where its prompt goes
                req = self._reqs.get(d.request_id)
                if req is not None and req.prefix and d.worker_id in self.borrower.index:
                    self.borrower.index.record(d.worker_id, req.prefix)
            if self.gate is not None and self.gate.holds(d):
                continue  # (handed on once the worker of an engine another replica started is made)
            self._inbox.append(d)  # (a decision of the core: Dispatch, Preempt, Reject; Load, Evict, ...)
        if self._inbox:
            self.kick()

    def handed(self, d: Decision) -> None:
        """A decision held by the gate goes on to the runtime."""
        self._inbox.append(d)
        self.kick()

    def _census(self, census_id: str) -> None:
        """Tell the leader every live request of this replica, queued or running where (the
        table entries it keeps: :class:`~laneway.cluster.codec.TableEntry`),
        in order with the other events: it rebuilds from that what Redis may have lost.
        Requests on lent slots are reported as running there: they are the leader's from
        now on (their ends are reported), and every loan ends."""
        if census_id in self._censused:
            return
        self._censused = {census_id}  # (the last leader's: once each)
        entries = []
        for rid, worker in self.running_now():
            req = self._reqs.get(rid)
            if req is None or rid not in self._mine:
                continue
            sent = Sent.of(req, self.home)
            entries.append(TableEntry(sent) if worker is None else TableEntry(sent, RUNNING, worker))
        self.borrower = Borrower(self.borrower.specs, down=self.borrower.down, index=self.borrower.index)
        self._emit(Census(census_id, self.home, tuple(entries)))
        self._owns()

    def schedule(self, now: float) -> list[Decision]:
        out, self._inbox = self._inbox, []
        for d in out:
            if type(d) in (Dispatch, Reject, Preempt):
                self._deadlines.drop(d.request_id)  # type: ignore[union-attr]
        if out and not self.fresh:  # (fencing: nothing starts on slots the leader may have given away)
            held = [d for d in out if type(d) is Dispatch]
            self._held += held
            for d in held:
                self._rearm(d.request_id, now)
            out = [d for d in out if type(d) is not Dispatch]
        for rid in self._deadlines.due(now, self.connected):  # (no decision in time: no leader reached)
            if rid in self._mine:
                self.cancel(rid, now)
                why = "the cluster's scheduler did not answer in time (is Redis reachable?)"
                out.append(Reject(rid, "queue_timeout", f"queued past its timeout: {why}", math.inf, 5.0))
        return out

    def next_wakeup(self) -> float:
        """When a request sent to the leader is given up on here (the leader's timers are its own)."""
        return self._deadlines.next()

    @property
    def fresh(self) -> bool:
        """Whether the leader cannot have taken this replica for dead: its last heartbeat got
        through less than two thirds of its liveness ago (the leader waits the whole of it)."""
        return time.monotonic() < self.last_heartbeat + ALIVE_TTL_S * 2 / 3

    @property
    def connected(self) -> bool:
        """Whether this replica reaches the cluster's Redis (a heartbeat got through lately)."""
        return time.monotonic() - self.last_heartbeat < ALIVE_TTL_S

    def estimate_wait(
        self,
        cls: int,
        model: str | None,
        now: float,
        est_service_s: float | None = None,
        *,
        raw: bool = False,
    ) -> float:
        """The leader's latest figure (corrected as its estimates are: ``raw`` is ignored)."""
        return self.figures.wait(self.names[cls], model)

    def estimate_range(
        self, cls: int, model: str | None, now: float, est_service_s: float | None = None
    ) -> tuple[float, WaitRange]:
        """The leader's latest figure and interval."""
        name = self.names[cls]
        return self.figures.wait(name, model), self.figures.range(name, model)

    def quota_refusal(self, tenant: str | None, cls: int, now: float) -> tuple[str, str, float] | None:
        """A class the tenant may not use (configuration, known here); its quotas are the
        leader's: counted where this replica leads (its core's clock is the wall clock), else
        left to the 429 the request would get."""
        core = self.leading_core()
        if core is not None:
            return core.quota_refusal(tenant, cls, time.time())
        pol = self._tenants.policy_for(tenant)
        if pol is not None and pol.allowed is not None and cls not in pol.allowed:
            return ("not_entitled", f"tenant {tenant!r} may not use class {self.names[cls]}", 0.0)
        return None

    def available_for(self, model: str | None) -> bool:
        return True

    @property
    def queued(self) -> int:
        return sum(self.figures.queued.values())

    @property
    def live(self) -> int:
        return len(self._mine)

    def snapshot(self) -> Snapshot:
        n = dict.fromkeys(self.names, 0)
        lent = self.borrower.running_per_class(self.names)  # (the leader does not count those)
        return Snapshot(
            queue_depth={**n, **self.figures.queued},
            running={k: self.figures.running.get(k, 0) + lent[k] for k in n},
            slots_total=0,
            slots_free=0,
            submitted=0,
            dispatched=0,
            drains=0,
            completed=n,
            preemptions=n,
            rejections={},
            model_loads=0,
        )

    # ------------------------------------------------------------------ plumbing
    async def _receive(self, last: str) -> None:
        loop = asyncio.get_running_loop()
        read_est = 0.0
        self._last = last
        while True:
            try:
                key = self.decisions_key
                got = await self.r.xread({key: self._last}, count=500, block=int(ESTIMATES_EVERY_S * 1000))
                self._reads.ok("replica %s: reads decisions again", self.replica)
                if key != self.decisions_key:
                    continue  # (this replica was taken for dead meanwhile: a stream of its new name)
                for entry_id, fields in stream_entries(got):
                    self._last = entry_id
                    self.deliver(json.loads(fields[b"b"]))
                if loop.time() - read_est >= ESTIMATES_EVERY_S:
                    read_est = loop.time()
                    if self.sizing is not None:
                        self.sizing.send()
                    await self._read_estimates()
            except asyncio.CancelledError:
                raise
            except (aioredis.RedisError, OSError) as exc:
                self._reads.warn("replica %s: cannot read decisions: %s", self.replica, exc)
                await asyncio.sleep(0.2)

    async def _read_estimates(self) -> None:
        raw = await self.r.get(self.p + "est")
        if raw is None:
            return
        fig = self.figures.read(json.loads(raw))
        if self.sizing is not None and fig.pace is not None:
            self.sizing.adopt(fig.pace)
        if fig.fleet is not None:  # (where the leader placed what)
            self.on_engines(set(fig.fleet["replicas"]))
            self.on_fleet(fig.fleet)
        if fig.failing is not None:
            self.on_failing(fig.failing)

    async def _heartbeat(self) -> None:
        while True:
            sent = time.monotonic()
            try:
                keys = [f"{self.p}alive:{self.home}", f"{self.p}dead:{self.home}", f"{self.p}leader"]
                alive, lease = await self._heartbeat_script(keys=keys, args=[int(ALIVE_TTL_S * 1000)])
                if lease:  # a new leader (its token): it is told what this replica's requests do
                    self._census(lease.decode().rpartition("|")[2])
                if alive:
                    # lent slots are used only while the leader cannot have taken it for dead
                    self.borrower.valid_until = sent + ALIVE_TTL_S * 2 / 3
                    self.last_heartbeat = sent
                    if self._held and self.fresh:
                        self._inbox = self._held + self._inbox
                        self._held = []
                        self.kick()
                else:  # the leader took this name for dead (a pause past its liveness)
                    await self._reborn()
            except (aioredis.RedisError, OSError):
                # Redis is away: what it holds may come back older (or not at all), and a new
                # leader may hold other loans than those this replica was lent: none is used
                # again until lent anew
                self.borrower.lent.clear()
            await asyncio.sleep(ALIVE_TTL_S / 3)

    async def _reborn(self) -> None:
        """Taken for dead (its liveness expired): the leader cancels what it scheduled for
        this replica and ends its loans, whether or not this process lives on. So it lives
        on under a new name, with nothing: its requests in flight are ended here (their slots
        are no longer theirs), and it schedules anew through the leader."""
        old, self.home = self.home, f"{self.replica}.{uuid.uuid4().hex[:8]}"
        self.decisions_key = f"{self.p}dec:{self.home}"
        self.outbox.reset(self.home)  # (the old name's events: moot)
        self._last = "0-0"
        lost = sorted(self._mine)
        self._mine.clear()
        self._reqs.clear()
        self._deadlines.clear()
        self._held = []
        self._inbox = []
        if self.gate is not None:
            self.gate.clear()
        self.borrower = Borrower(self.borrower.specs, index=self.borrower.index)
        log.warning(
            "replica %s was taken for dead (%s expired): %d requests in flight ended; it goes on as %s",
            self.replica,
            old,
            len(lost),
            self.home,
        )
        # (ended before anything is awaited: a Redis error there must not leave them unended)
        self.on_reborn(self.home, lost)
        await self.r.set(f"{self.p}alive:{self.home}", "1", px=int(ALIVE_TTL_S * 1000))
        self.last_heartbeat = time.monotonic()
        self._owns()
