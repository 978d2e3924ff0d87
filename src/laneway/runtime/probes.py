"""Worker health, probed all the time: placement never sends work to a worker that is down.

Every worker is probed (``Worker.health()``: an upstream's ``/models``, which
must list its model) every ``probe_interval_s``, and once at start-up. A
worker is taken out of placement when a probe fails (a probe that only timed
out must fail twice in a row: a busy upstream is slow, not gone) or when a
request fails on it for a reason of the worker's (it cannot be reached, it
stalled, it answered 5xx); it is put back, and waiting requests are
dispatched, by the first probe that succeeds. One that came back after a probe
found nothing there (or another engine, or not its model) is taken as a fresh engine:
placement expects nothing in its prefix cache.

While no worker for a model is up, its requests are held: each waits at most
``unavailable_hold_s`` (from its arrival, or from the moment its model lost
its last worker) for one to come back, and is then answered 503
``no_healthy_worker`` with a ``Retry-After`` of the next probe (a hold of 0
answers at once).
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from laneway.backends.base import Health
from laneway.errors import Unavailable
from laneway.runtime.ticket import Phase, Ticket

if TYPE_CHECKING:
    from laneway.runtime.runtime import Runtime

log = logging.getLogger("laneway.runtime")

PROBE_TIMEOUT_S = 2.5  # a probe not answered by then failed (transiently)
TRANSIENT_FAILURES = 2  # timed-out probes in a row that take a worker out


@dataclass
class WorkerHealth:
    ok: bool = True
    detail: str = "not probed yet"
    failures: int = 0  # transient failures in a row
    failing_since: float = math.nan  # (loop time) the first failed probe of those in a row
    next_probe_s: float = 0.0  # loop time of its next probe
    lost: str = ""  # why a probe found no engine there (or another one), until one answers
    asked: bool = False  # a probe asked by :meth:`Prober.check` is on its way


class Prober:
    def __init__(self, runtime: Runtime, interval_s: float, hold_s: float) -> None:
        self.rt = runtime
        self.interval_s = interval_s
        self.hold_s = hold_s
        self.state = {name: WorkerHealth() for name in runtime.workers}
        self.down: set[str] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._by_name: dict[str, asyncio.Task[None]] = {}

    # ------------------------------------------------------------ probing
    async def start(self) -> None:
        """Probe every worker once now, then keep probing in the background."""
        await asyncio.gather(*(self.probe(name) for name in self.rt.workers))
        loop = asyncio.get_running_loop()
        self._loops = [loop.create_task(self._keep_probing(name)) for name in self.rt.workers]

    async def add(self, name: str) -> None:
        """A worker joined (a fleet's engine, ready): probe it now and from now on."""
        self.state[name] = WorkerHealth()
        await self.probe(name)
        task = asyncio.get_running_loop().create_task(self._keep_probing(name))
        self._loops.append(task)
        self._by_name[name] = task

    def remove(self, name: str) -> None:
        """A worker left: no more probes."""
        task = self._by_name.pop(name, None)
        if task is not None:
            task.cancel()
            self._loops.remove(task)
        self.state.pop(name, None)
        self.down.discard(name)

    async def close(self) -> None:
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)

    async def _keep_probing(self, name: str) -> None:
        while not self.rt.closed and name in self.state:
            await asyncio.sleep(max(self.state[name].next_probe_s - self.rt.now(), 0.0))
            await self.probe(name)

    async def probe(self, name: str) -> None:
        st = self.state[name]
        st.next_probe_s = self.rt.now() + self.interval_s
        try:
            health = await asyncio.wait_for(self.rt.workers[name].health(), PROBE_TIMEOUT_S)
        except TimeoutError:
            health = Health(False, f"its health probe took over {PROBE_TIMEOUT_S:g} s", transient=True)
        except Exception as exc:  # a probe that breaks is a failed one
            health = Health(False, f"its health probe failed: {exc or type(exc).__name__}")
        st.ok, st.detail = health.ok, health.detail
        if health.ok:
            st.failures = 0
            st.failing_since = math.nan
            if st.lost:
                self.rt.engines.engine_back(name, f"back after: {st.lost}")
                st.lost = ""
            try:
                await self.rt.engines.probed(name)
            except Exception:  # (what it learns is an aid: a failure here is no failed probe)
                log.exception("worker %s: reading its engine's gauges failed", name)
            if name in self.down:
                self._up(name)
            return
        if not health.transient:  # gone, or another engine answers: what comes back is cold
            st.lost = health.detail
        st.failures = st.failures + 1 if health.transient else TRANSIENT_FAILURES
        now = self.rt.now()
        if math.isnan(st.failing_since):
            st.failing_since = now
        if st.failures >= TRANSIENT_FAILURES:
            self.take_out(name, health.detail)
        fleet = self.rt.fleet
        if fleet is not None and now - st.failing_since >= fleet.cfg.hung_after_s and fleet.owns(name):
            # (an engine it started, alive and silent: none would be started in its place)
            silent = now - st.failing_since
            fleet.hung(name, f"it answered no health probe for {silent:.0f} s ({health.detail})")

    def check(self, name: str) -> None:
        """Probe worker ``name`` now (a request's answer on it broke off: if its engine is
        gone, it is out of placement at once, not at its next probe)."""
        st = self.state.get(name)
        if st is None or st.asked or self.rt.closed:
            return
        st.asked = True

        async def asked() -> None:
            try:
                if self.state.get(name) is st:  # (not removed meanwhile)
                    await self.probe(name)
            finally:
                st.asked = False

        self.rt.spawn(asked())

    # ------------------------------------------------------------ placement
    def take_out(self, name: str, reason: str) -> None:
        """Worker ``name`` cannot serve now: no new work goes to it until a probe succeeds.
        (A worker removed already — a fleet's engine gone while a run on it failed — has
        nothing to take out.)"""
        st = self.state.get(name)
        if st is None:
            return
        st.ok, st.detail = False, reason
        if name in self.down:
            return
        self.down.add(name)
        rt = self.rt
        rt.sched.set_available(name, False)
        log.warning("worker %s is down: %s", name, reason)
        model = rt.served.get(name, name)
        if not self.serving(model):
            now = rt.now()
            for ticket in list(rt.tickets.values()):
                if ticket.job.model == model and ticket.phase is Phase.QUEUED:
                    self.hold(ticket, now)

    def why_down(self, name: str) -> str | None:
        """Why worker ``name`` is out of placement (``None``: it is in service)."""
        st = self.state.get(name)
        return (st.detail if st is not None else "removed") if name in self.down else None

    def _up(self, name: str) -> None:
        self.down.discard(name)
        self.rt.sched.set_available(name, True)
        log.warning("worker %s is healthy again", name)
        self.rt.kick()

    def serving(self, model: str) -> bool:
        """Whether some worker for ``model`` is up (a fleet's models: whether it may start one)."""
        fleet = self.rt.fleet
        if fleet is not None and model in fleet.cfg.inventory.models:
            return fleet.faults.refusal(model) is None
        return any(m == model and w not in self.down for w, m in self.rt.served.items())

    def retry_after(self, model: str) -> float:
        """Seconds until the next probe of a worker for ``model`` (when one may be back)."""
        now = self.rt.now()
        due = [
            self.state[w].next_probe_s for w, m in self.rt.served.items() if m == model and w in self.state
        ]
        return max(min(due, default=now) - now, 1.0)

    # ------------------------------------------------------------ holding requests
    def hold(self, ticket: Ticket, now: float) -> None:
        """``ticket``'s model has no worker up: it waits at most the hold for one."""
        self.rt.loop.call_at(now + self.hold_s, self._hold_over, ticket)

    def unavailable(self, model: str) -> Unavailable:
        reasons = "; ".join(
            f"{w}: {self.state[w].detail}"
            for w, m in self.rt.served.items()
            if m == model and w in self.state
        )
        back = math.ceil(self.retry_after(model))  # (it cannot start before a worker is back:
        return Unavailable(  # the next probe, at the soonest; what it would wait is not known)
            f"no healthy worker serves model {model!r} ({reasons})",
            code="no_healthy_worker",
            retry_after_s=back,
            estimated_wait_s=None,
        )

    def _hold_over(self, ticket: Ticket) -> None:
        rt = self.rt
        model = ticket.job.model
        if ticket.ended or ticket.phase is not Phase.QUEUED or self.serving(model):
            return
        rt.withdraw(ticket, self.unavailable(model))
