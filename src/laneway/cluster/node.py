"""One replica of a cluster: its runtime's scheduler is the leader's, wherever it runs.

:func:`join` puts a :class:`~laneway.cluster.remote.RemoteScheduler` in the
runtime's place of the core, and campaigns for the lease: while this replica
holds it, its :class:`~laneway.cluster.leader.Leader` schedules for all.

The node also watches whether Redis still holds what the cluster wrote
(:mod:`laneway.cluster.generation`). When it does not, the replica stops taking
what it could not keep (new files and batches: 503 ``state_lost``; batch lines
are not started), says so (``/readyz`` fails, an ERROR names what was lost and
how to restore it), and goes on serving requests: the leader is rebuilt from
what the replicas report they run. ``laneway cluster accept-loss`` ends that.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

import redis.asyncio as aioredis

from laneway.bus import BusUnavailable, connect
from laneway.cluster import tasks
from laneway.cluster.agreement import compare, decided_by
from laneway.cluster.dispatch_gate import DispatchGate
from laneway.cluster.fleet_book import FleetBook
from laneway.cluster.fleet_replica import ClusterPlacing, EngineDirectory
from laneway.cluster.generation import CHECK, RECORD, Generation, Loss
from laneway.cluster.journal import Journal
from laneway.cluster.leader import Leader
from laneway.cluster.lease import Campaign, Lease
from laneway.cluster.liveness import ALIVE_TTL_S
from laneway.cluster.remote import RemoteScheduler
from laneway.config.schema import ClusterConfig
from laneway.core import ConfigError

log = logging.getLogger("laneway.cluster")

LEASE_TTL_S = 3.0  # a dead leader is replaced within this (plus one try, LEASE_TTL_S / 6)
NAMED_AT_MOST = 20  # lost objects named in the log line (the rest counted)
HOW_TO_RESTORE = (
    "to get it back, stop Redis and start it from the newest copy of its data you have "
    "(its appendonlydir, a backup) and run `laneway cluster accept-loss --config FILE`; to go on "
    "without it, run only the latter. Until then new files and batches are refused and no "
    "batch line is started; requests are served"
)


class Node:
    def __init__(
        self,
        client: aioredis.Redis,
        remote: RemoteScheduler,
        leader: Leader,
        campaign: Campaign,
        generation: Generation,
        journal: Journal | None,
    ) -> None:
        self.client = client
        self.remote = remote
        self.leader = leader
        self.campaign = campaign
        self.generation = generation
        self.journal = journal
        self.loss: Loss | None = None  # Redis came back without the cluster's data (not accepted yet)
        self.prefix = remote.p
        self._check = client.register_script(CHECK)
        self._record = client.register_script(RECORD)
        self._task: asyncio.Task[None] | None = None
        self.settings: dict[str, Any] | None = None  # what its core schedules by (told the others)

    def status(self) -> dict[str, object]:
        """For ``/readyz``: whether this replica reaches the cluster's Redis and Redis holds the
        cluster's data; who leads."""
        connected = self.remote.connected
        if self.loss is not None:
            detail = f"{self.loss.message}; {HOW_TO_RESTORE}"
        else:
            detail = "Redis reachable" if connected else "the cluster's Redis cannot be reached"
        return {
            "ok": connected and self.loss is None,
            "detail": detail,
            "replica": self.remote.replica,
            "leader": self.remote.figures.leader,
            "leading": self.leader.leading,
        }

    def refusal(self) -> str | None:
        """Why new files and batches are refused now (``None``: they are not)."""
        if self.loss is None:
            return None
        return f"{self.loss.message}: nothing new is kept until an operator restores it or accepts the loss"

    def created(self, kind: str, object_id: str, tenant: str) -> None:
        """A batch or file was created (or a file deleted) through this replica."""
        if self.journal is not None:
            self.journal.record(kind, object_id, tenant)

    # ------------------------------------------------------------------ the generation check
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def check(self) -> None:
        """One generation check (and a count in Redis): notices a loss, or its acceptance."""
        gen = self.generation
        got = await self._check(keys=gen.keys(), args=gen.args())
        loss = gen.judge(got)
        if loss is not None:
            keys = [self.prefix + "lost", self.prefix + "gen", self.prefix + "gen:seq"]
            raw = await self._record(keys=keys, args=[loss.to_json(), uuid.uuid4().hex[:16]])
            await self._lost(Loss.from_json(raw) or loss)
            return
        recorded = gen.recorded(got)
        if recorded is not None and self.loss is None:
            await self._lost(recorded)
        elif recorded is None and self.loss is not None:
            log.warning("the loss of laneway's data in Redis was accepted: new files and batches are taken")
            self.loss = None
            await self.tell()  # (what it told the others went with the data)

    async def tell(self) -> None:
        """Write what this replica schedules by for the others to compare (warning of each
        live one that differs): as it joins, and again once a loss of Redis's data is
        accepted."""
        if self.settings is None:
            return
        try:
            await compare(self.client, self.prefix, self.remote.replica, self.settings)
        except (aioredis.RedisError, OSError) as exc:  # (only a warning is lost: it runs on)
            log.warning(
                "replica %r could not compare its configuration with others: %s", self.remote.replica, exc
            )

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(ALIVE_TTL_S / 3)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except (aioredis.RedisError, OSError):
                pass  # (unreachable: the heartbeat says so)
            except Exception:
                log.exception("the generation check failed")

    async def _lost(self, loss: Loss) -> None:
        self.loss = loss
        lost = await self._name_lost(loss)
        named = ", ".join(f"{kind} {oid}" for kind, oid in lost[:NAMED_AT_MOST])
        more = f" and {len(lost) - NAMED_AT_MOST} more" if len(lost) > NAMED_AT_MOST else ""
        what = f"lost through this replica: {named}{more}" if lost else "nothing made here is missing"
        log.error("%s; %s; %s", loss.message, what, HOW_TO_RESTORE)
        if self.leader.leading:  # its state rests on what Redis lost: a leader rebuilds it
            await self.campaign.step_down()

    async def _name_lost(self, loss: Loss) -> list[tuple[str, str]]:
        """The batches and files created through this replica that Redis no longer holds,
        recorded in Redis (``PREFIX lostids``) for every replica to answer them 410."""
        if self.journal is None:
            return []
        created = self.journal.created()
        if not created:
            return []
        pipe = self.client.pipeline(transaction=False)
        for c in created:
            pipe.exists(f"{self.prefix}{'b' if c.kind == 'batch' else 'f'}:{c.id}")
        found = await pipe.execute()
        gone = [c for c, there in zip(created, found, strict=True) if not there]
        if gone:
            mapping = {
                c.id: json.dumps({"kind": c.kind, "tenant": c.tenant, "at": c.at, "lost": loss.message})
                for c in gone
            }
            await self.client.hset(self.prefix + "lostids", mapping=mapping)  # type: ignore[arg-type]
        return [(c.kind, c.id) for c in gone]

    async def close(self) -> None:
        await tasks.stop(self._task)
        self.generation.save(force=True)
        await self.campaign.close()
        await self.remote.close()
        await self.client.aclose()


async def join(runtime: object, cluster: ClusterConfig) -> Node:
    """``runtime`` (a :class:`~laneway.runtime.Runtime`) schedules through the cluster's leader."""
    from laneway.runtime import Runtime
    from laneway.runtime.rejections import taken_for_dead

    assert isinstance(runtime, Runtime)
    try:
        client = connect(cluster.redis_url)
    except BusUnavailable as exc:
        raise ConfigError(f"cluster.redis_url: {exc}") from None
    await client.ping()
    config = runtime.config
    fleet = runtime.fleet
    remote = RemoteScheduler(
        client,
        cluster.key_prefix,
        cluster.replica,
        runtime.classes.names,
        runtime.kick,
        specs=runtime.specs,
        config=config.scheduler,
        lend_max_s=cluster.lend_max_s if fleet is None else 0.0,  # (a fleet's engines come and go)
    )
    remote.on_lent_start = runtime.metrics.lent_starts.inc
    runtime.use_scheduler(remote)
    runtime.sizing = remote.share(runtime.sizing)
    leader = Leader(
        client,
        cluster.key_prefix,
        cluster.replica,
        remote.home,
        runtime.specs,
        config.scheduler,
        config.policy,
        runtime.models,
        remote.deliver,
        lend_reserve=cluster.lend_reserve,
        lending=cluster.lend_max_s > 0 and fleet is None,
        fleet=None if config.fleet is None else FleetBook(config.fleet, config.scheduler, config.policy),
    )
    placing: ClusterPlacing | None = None
    if fleet is not None:  # this replica starts the engines of its node; it reaches the others'
        assert config.fleet is not None
        fleet.node = remote.node = config.fleet.node
        fleet.placing = placing = ClusterPlacing(runtime, remote, client, cluster.key_prefix)
        directory = EngineDirectory(runtime, fleet, client, cluster.key_prefix)
        remote.gate = DispatchGate(directory.knows, directory.fetch, remote.handed, remote.replica)
        remote.on_engines = directory.listed
        remote.on_failing = fleet.faults.elsewhere

        def shown(view: dict[str, Any]) -> None:
            fleet.cluster_view = view

        remote.on_fleet = shown

    async def engine_load(worker: str) -> int | None:
        w = runtime.workers.get(worker)
        return None if w is None else await w.engine_load()

    leader.engine_load = engine_load
    lease = Lease(
        client, cluster.key_prefix, cluster.replica, ttl_s=LEASE_TTL_S, priority=cluster.leader_priority
    )
    leader.use(lease)

    def reborn(home: str, lost: list[str]) -> None:
        leader.me = home
        if placing is not None:  # (its engines, under its new name)
            runtime.spawn(placing.reborn())
        for rid in lost:
            ticket = runtime.tickets.get(rid)
            if ticket is not None:
                runtime.cancel(ticket, taken_for_dead())

    def census() -> list[tuple[str, str | None]]:
        """What this replica's requests are doing now: (id, the worker it runs on or None)."""
        from laneway.runtime.ticket import Phase

        out: list[tuple[str, str | None]] = []
        for rid, t in runtime.tickets.items():
            if t.phase is Phase.QUEUED:
                out.append((rid, None))
            elif t.phase in (Phase.RUNNING, Phase.STOPPING):
                out.append((rid, t.worker))
        return out

    remote.on_reborn = reborn
    remote.leading_core = lambda: leader.core
    remote.running_now = census
    generation = Generation(config.data_dir, cluster.key_prefix, cluster.replica)
    journal = Journal(config.data_dir) if config.data_dir is not None else None
    campaign = Campaign(lease, leader.lead, leader.lose, every_s=LEASE_TTL_S / 6)
    node = Node(client, remote, leader, campaign, generation, journal)
    node.settings = decided_by(config.policy, config.scheduler, runtime.specs)
    await node.tell()
    await node.check()  # (a replica that was down while Redis lost its data sees it now)
    await remote.start()
    campaign.start()
    node.start()
    return node
