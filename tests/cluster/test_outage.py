"""A replica whose cluster (its Redis, its leader) is out of reach gives its requests up at
their queue timeout and a grace, with a 503 that says so: those never dispatched, and those
back in the leader's hands after a start (a retryable failure requeued it). While the
cluster is reachable, a request back with the leader waits its turn there."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from laneway.backends.base import Sink
from laneway.backends.simulated import SimulatedWorker
from laneway.backends.upstream import UpstreamUnavailable
from laneway.cluster.codec import encode
from laneway.cluster.local_deadlines import LOCAL_GRACE_S
from laneway.cluster.remote import RemoteScheduler
from laneway.config import ServerConfig, WorkerConfig
from laneway.core import Dispatch
from laneway.errors import Unavailable
from laneway.generation import Failed, Job, SamplingParams
from laneway.runtime import Runtime
from laneway.runtime.ticket import Phase

TIMEOUT_S = 0.5


class FailsFirst(SimulatedWorker):
    """Its engine drops request "started" 0.1 s in (a 503: retryable, elsewhere or later)."""

    async def run(self, job: Job, sink: Sink) -> None:
        if job.id == "started":
            err = UpstreamUnavailable("upstream answered 503", worker_fault=False)
            asyncio.get_running_loop().call_later(0.1, sink, Failed(job.id, err))
            return
        await super().run(job, sink)


def _job(jid: str) -> Job:
    return Job(jid, "sim", SamplingParams(max_tokens=3, temperature=0.0), prompt="p")


def _replica() -> tuple[Runtime, RemoteScheduler]:
    """A replica's runtime and scheduler whose Redis tasks never start: no decision comes."""
    rt = Runtime(
        replace(ServerConfig(), workers=(WorkerConfig("w0", "simulated", "sim", "sim", 2),)),
        {"w0": FailsFirst("w0", "sim", 2)},
    )
    remote = RemoteScheduler(
        None, "laneway:", "a", rt.classes.names, rt.kick, specs=rt.specs, config=rt.config.scheduler
    )
    rt.use_scheduler(remote)
    remote.last_heartbeat = time.monotonic()  # (its last heartbeat got through just now)
    return rt, remote


def test_out_of_reach_a_request_requeued_after_its_start_is_given_up_as_one_never_dispatched() -> None:
    async def go() -> dict[str, str]:
        rt, remote = _replica()
        tickets = [rt.submit(_job(jid), 1, timeout_s=TIMEOUT_S) for jid in ("started", "waiting")]
        remote.deliver([encode(Dispatch("started", "w0", None))])  # ... then the cluster went away
        out: dict[str, str] = {}
        for t in tickets:
            try:
                await asyncio.wait_for(t.result(), TIMEOUT_S + LOCAL_GRACE_S + 5)
                out[t.id] = "done"
            except Unavailable as exc:
                out[t.id] = exc.message
        rt.closed = True
        return out

    ended = asyncio.run(go())
    assert ended.keys() == {"started", "waiting"}
    assert all("is Redis reachable?" in why for why in ended.values()), ended


def test_reachable_a_request_requeued_after_its_start_waits_its_turn_with_the_leader() -> None:
    async def go() -> tuple[Phase, bool]:
        rt, remote = _replica()
        ticket = rt.submit(_job("started"), 1, timeout_s=TIMEOUT_S)
        remote.deliver([encode(Dispatch("started", "w0", None))])
        until = time.monotonic() + TIMEOUT_S + LOCAL_GRACE_S + 1.0  # past its deadline ...
        while time.monotonic() < until:
            remote.last_heartbeat = time.monotonic()  # ... with heartbeats getting through
            await asyncio.sleep(0.1)
        phase = ticket.phase
        rt.closed = True
        return phase, "started" in remote._mine

    phase, mine = asyncio.run(go())
    assert phase is Phase.QUEUED and mine  # not given up: the leader has it, and will decide
