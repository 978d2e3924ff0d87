"""A small driver that applies scheduler decisions the way the simulator does.

It keeps its own view of what is running, what is being stopped and how every
request ended, and checks each decision against that view before applying it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from laneway.core import Decision, Dispatch, Preempt, Reject, Request, Scheduler, SchedulerConfig, WorkerSpec


def req(rid: str, priority: int, arrival_s: float = 0.0, **kw: object) -> Request:
    return Request(rid, priority, arrival_s, **kw)  # type: ignore[arg-type]


def slots(n: int, **kw: object) -> list[WorkerSpec]:
    """``n`` single-slot workers ``w0`` … ``w{n-1}``."""
    return [WorkerSpec(f"w{i}", 1, **kw) for i in range(n)]  # type: ignore[arg-type]


def sched(n_slots: int = 1, policy: str = "laneway", **cfg: object) -> Scheduler:
    config = SchedulerConfig(**cfg) if cfg else None  # type: ignore[arg-type]
    return Scheduler(slots(n_slots), config, policy)


def ids(decisions: Iterable[Decision], kind: type | None = None) -> list[str]:
    return [d.request_id for d in decisions if kind is None or type(d) is kind]


@dataclass
class Driver:
    """Feeds a scheduler like the simulator: submit, apply decisions, acknowledge."""

    sched: Scheduler
    now: float = 0.0
    running: dict[str, str] = field(default_factory=dict)  # id -> worker (incl. stopping)
    stopping: dict[str, str] = field(default_factory=dict)  # id -> preemption mode
    resume_mode: dict[str, str] = field(default_factory=dict)  # id -> mode of its last preemption
    ended: dict[str, str] = field(default_factory=dict)  # id -> how it ended
    submitted: list[str] = field(default_factory=list)
    log: list[tuple[float, Decision]] = field(default_factory=list)
    preempt_counts: dict[str, int] = field(default_factory=dict)
    check: bool = True

    # -- events -------------------------------------------------------------
    def submit(self, r: Request) -> Reject | None:
        assert r.id not in self.ended and r.id not in self.submitted
        self.submitted.append(r.id)
        out = self.sched.submit(r, self.now)
        if out is not None:
            assert out.request_id == r.id
            self._end(r.id, "rejected")
        self._check()
        return out

    def finish(self, rid: str, *, failed: bool = False) -> None:
        assert rid in self.running, rid
        self.sched.finished(rid, self.now, failed=failed)
        del self.running[rid]
        self.stopping.pop(rid, None)
        self._end(rid, "failed" if failed else "finished")
        self._check()

    def ack(self, rid: str) -> None:
        """The worker stopped a preempted request: its slot is free."""
        assert rid in self.stopping, rid
        self.sched.preempted(rid, self.now)
        del self.running[rid]
        self.resume_mode[rid] = self.stopping.pop(rid)
        self._check()

    def cancel(self, rid: str) -> bool:
        live = rid in self.sched
        done = self.sched.cancel(rid, self.now)
        assert done == live
        if done:
            self.running.pop(rid, None)
            self.stopping.pop(rid, None)
            self._end(rid, "cancelled")
        self._check()
        return done

    def step(self) -> list[Decision]:
        """Call ``schedule(now)`` and apply what it says."""
        out = self.sched.schedule(self.now)
        for d in out:
            self.log.append((self.now, d))
            self.apply(d)
        self._check()
        return out

    def apply(self, d: Decision) -> None:
        """Apply one decision (a GPU-aware driver adds loads and evictions)."""
        if type(d) is Dispatch:
            assert d.request_id not in self.running, f"{d.request_id} dispatched twice"
            assert d.request_id not in self.ended, f"{d.request_id} dispatched after it ended"
            assert d.resume == self.resume_mode.pop(d.request_id, None), d
            self.running[d.request_id] = d.worker_id
        elif type(d) is Preempt:
            assert self.running.get(d.request_id) == d.worker_id, f"{d} of a request not running"
            assert d.request_id not in self.stopping, f"{d.request_id} preempted twice"
            assert d.mode in ("checkpoint", "recompute"), d
            self.stopping[d.request_id] = d.mode
            self.preempt_counts[d.request_id] = self.preempt_counts.get(d.request_id, 0) + 1
        else:
            assert type(d) is Reject, f"unexpected decision {d}"
            assert d.request_id not in self.running, f"{d.request_id} rejected while running"
            assert math.isfinite(d.estimated_wait_s) or d.reason != "queue_timeout"
            self._end(d.request_id, "expired" if d.reason == "queue_timeout" else "rejected")

    def advance(self, dt: float) -> list[Decision]:
        """Move the clock by ``dt``, calling ``schedule`` at every wakeup on the way."""
        target = self.now + dt
        out: list[Decision] = []
        spins = 0
        while (wake := self.sched.next_wakeup()) <= target:
            spins = spins + 1 if wake <= self.now else 0
            assert spins < 5, f"next_wakeup() stays at {wake} <= now {self.now}"
            self.now = max(self.now, wake)
            out += self.step()
        self.now = target
        out += self.step()
        return out

    def drain(self, limit: int = 10_000) -> None:
        """Let everything run to the end: acknowledge stops, finish runs, follow wakeups."""
        for _ in range(limit):
            if not self.sched.live:
                return
            for rid in sorted(self.stopping):
                self.ack(rid)
            self.step()
            for rid in sorted(self.running):
                if rid not in self.stopping:
                    self.finish(rid)
            self.now += 1.0
            wake = self.sched.next_wakeup()
            if math.isfinite(wake):
                self.now = max(self.now, wake)
            self.step()
        raise AssertionError(f"the system did not drain: {self.sched.live} requests still live")

    # -- bookkeeping --------------------------------------------------------
    def _end(self, rid: str, how: str) -> None:
        assert rid not in self.ended, f"{rid} ended twice ({self.ended[rid]}, then {how})"
        self.ended[rid] = how

    def _check(self) -> None:
        if self.check:
            self.sched.check_invariants()


def two_engines(placement: str = "least-loaded", slots: int = 4) -> Driver:
    cfg = SchedulerConfig(placement=placement)
    return Driver(Scheduler([WorkerSpec("a", slots), WorkerSpec("b", slots)], cfg))
