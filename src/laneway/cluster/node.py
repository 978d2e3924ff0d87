"""One replica of a cluster: its runtime's scheduler is the leader's, wherever it runs.

:func:`join` puts a :class:`~laneway.cluster.remote.RemoteScheduler` in the
runtime's place of the core, and campaigns for the lease: while this replica
holds it, its :class:`~laneway.cluster.leader.Leader` schedules for all.
"""

from __future__ import annotations

import logging

import redis.asyncio as aioredis

from laneway.cluster.leader import Leader
from laneway.cluster.lease import Campaign, Lease
from laneway.cluster.remote import RemoteScheduler
from laneway.config.schema import ClusterConfig

log = logging.getLogger("laneway.cluster")

LEASE_TTL_S = 3.0  # a dead leader is replaced within this (plus one try, LEASE_TTL_S / 6)


class Node:
    def __init__(
        self, client: aioredis.Redis, remote: RemoteScheduler, leader: Leader, campaign: Campaign
    ) -> None:
        self.client = client
        self.remote = remote
        self.leader = leader
        self.campaign = campaign

    def status(self) -> dict[str, object]:
        """For ``/readyz``: whether this replica reaches the cluster's Redis, who leads."""
        connected = self.remote.connected
        detail = "Redis reachable" if connected else "the cluster's Redis cannot be reached"
        return {
            "ok": connected,
            "detail": detail,
            "replica": self.remote.replica,
            "leader": self.remote.live_leader,
            "leading": self.leader.leading,
        }

    async def close(self) -> None:
        await self.campaign.close()
        await self.remote.close()
        await self.client.aclose()


async def join(runtime: object, cluster: ClusterConfig) -> Node:
    """``runtime`` (a :class:`~laneway.runtime.Runtime`) schedules through the cluster's leader."""
    from laneway.runtime import Runtime
    from laneway.runtime.rejections import taken_for_dead

    assert isinstance(runtime, Runtime)
    client = aioredis.Redis.from_url(cluster.redis_url, socket_timeout=10, socket_connect_timeout=10)
    await client.ping()
    config = runtime.config
    remote = RemoteScheduler(
        client,
        cluster.key_prefix,
        cluster.replica,
        runtime.classes.names,
        runtime.kick,
        specs=runtime.specs,
        config=config.scheduler,
        lend_max_s=cluster.lend_max_s,
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
        lending=cluster.lend_max_s > 0,
    )

    async def engine_load(worker: str) -> int | None:
        w = runtime.workers.get(worker)
        ask = getattr(w, "engine_load", None)
        return None if ask is None else await ask()  # type: ignore[no-any-return]

    leader.engine_load = engine_load
    lease = Lease(
        client, cluster.key_prefix, cluster.replica, ttl_s=LEASE_TTL_S, priority=cluster.leader_priority
    )
    leader.use(lease)

    def reborn(home: str, lost: list[str]) -> None:
        leader.me = home
        for rid in lost:
            ticket = runtime.tickets.get(rid)
            if ticket is not None:
                runtime.cancel(ticket, taken_for_dead())

    remote.on_reborn = reborn
    campaign = Campaign(lease, leader.lead, leader.lose, every_s=LEASE_TTL_S / 6)
    await remote.start()
    campaign.start()
    return Node(client, remote, leader, campaign)
