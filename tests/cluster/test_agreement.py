"""Replicas that schedule by different configurations are told so at start: the leader's
decides for all, so a replica whose workers, classes or ``[scheduler]`` differ would change
the cluster's scheduling when it leads."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid

import pytest

from laneway.bus import connect
from laneway.cluster.agreement import compare, decided_by, differences
from laneway.core import SchedulerConfig, TenantPolicy, WorkerSpec

WORKERS = [WorkerSpec("up0", 4, isolate=True), WorkerSpec("up1", 4)]


def test_each_difference_is_named_with_both_values() -> None:
    mine = decided_by("laneway", SchedulerConfig(), WORKERS)
    assert differences(mine, decided_by("laneway", SchedulerConfig(), list(WORKERS))) == []
    other = [dataclasses.replace(WORKERS[0], isolate=False, slots=2), WorkerSpec("up2", 1)]
    theirs = decided_by("priority", SchedulerConfig(hold_s=0.25), other)
    assert differences(mine, theirs) == [
        'policy: "laneway" here, "priority" there',
        "scheduler.hold_s: 0.0 here, 0.25 there",
        "workers.up0.isolate: true here, false there",
        "workers.up0.slots: 4 here, 2 there",
        "workers.up1: only here",
        "workers.up2: only there",
    ]
    # within a table, the key that differs (a tenant added, another's cap)
    tenants = {"A": TenantPolicy(max_concurrent=2), "B": TenantPolicy()}
    theirs = decided_by("laneway", SchedulerConfig(tenants={**tenants, "C": TenantPolicy()}), WORKERS)
    mine = decided_by("laneway", SchedulerConfig(tenants={**tenants, "A": TenantPolicy()}), WORKERS)
    assert differences(mine, theirs) == [
        "scheduler.tenants.A.max_concurrent: null here, 2 there",
        "scheduler.tenants.C: only there",
    ]


def test_a_replica_is_warned_of_each_live_replica_that_differs(
    bus_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def go() -> tuple[list[str], list[str], list[str]]:
        prefix = f"agree{uuid.uuid4().hex[:8]}:"
        client = connect(bus_url)
        try:
            same = decided_by("laneway", SchedulerConfig(), WORKERS)
            other = decided_by("laneway", SchedulerConfig(), [dataclasses.replace(WORKERS[0], isolate=False)])
            first = await compare(client, prefix, "r1", same)  # (nobody else yet)
            await client.set(prefix + "alive:r1.0a1b2c3d", "1")
            await compare(client, prefix, "gone", other)  # (written, but not alive: not compared)
            agreeing = await compare(client, prefix, "r2", same)
            await client.set(prefix + "alive:r2.00ff00ff", "1")
            differing = await compare(client, prefix, "r3", other)
            return first, agreeing, differing
        finally:
            await client.aclose()

    with caplog.at_level(logging.WARNING, logger="laneway.cluster"):
        first, agreeing, differing = asyncio.run(go())
    assert first == [] and agreeing == []
    assert len(differing) == 2  # (r1 and r2, both live; "gone" is not)
    assert differing[0].startswith("replica 'r3' schedules by another configuration than replica 'r1' (")
    assert "workers.up0.isolate: false here, true there" in differing[0]
    assert "workers.up1: only there" in differing[0] and "'r2'" in differing[1]
    logged = [r.getMessage() for r in caplog.records if r.name == "laneway.cluster"]
    assert logged[-2:] == differing and len(logged) == 3  # ("gone" was told of r1)
