"""Looking inside the scheduler: gauges for metrics, and invariant checks.

A mixin of :class:`~laneway.core.scheduler.Scheduler`.
"""

from __future__ import annotations

from laneway.core.request import State
from laneway.core.stats import Snapshot

_RUNNING = State.RUNNING
_PREEMPTED = State.PREEMPTED
_QUEUED = State.QUEUED


class Inspecting:
    __slots__ = ()  # the scheduler's attributes are slots (see Scheduler)

    def snapshot(self) -> Snapshot:
        names = self.classes.names
        c = self.counters
        return Snapshot(
            queue_depth={n: self.lanes.class_count[i] for i, n in enumerate(names)},
            running={n: len(self._running[i]) for i, n in enumerate(names)},
            slots_total=self.slots,
            slots_free=self._free,
            submitted=self._seq,
            dispatched=c.dispatched,
            drains=c.drains,
            completed=dict(zip(names, self.service.n, strict=True)),
            preemptions=dict(zip(names, c.preemptions, strict=True)),
            rejections=dict(c.rejections),
            model_loads=c.model_loads,
            **(self._planner.gauges() if self._planner is not None else {}),
        )

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if the internal state is inconsistent."""
        if self._planner is not None:
            self._planner.check()
            ready = {rid for rid, r in self._planner.replicas.items() if r.ready}
            assert ready == set(self.workers), "ready replicas and workers differ"
        assert self.slots == sum(w.spec.slots for w in self.workers.values())
        k = len(self.classes)
        queued = [0] * k
        incoming = [0] * k
        on_workers: dict[str, str] = {}
        for w in self.workers.values():
            assert 0 <= w.free == w.spec.slots - len(w.running) - w.held, f"worker {w.id} slot count"
            assert w.held >= 0, f"worker {w.id} holds {w.held}"
            for rid, r in w.running.items():
                assert rid not in on_workers, f"{rid} on two workers"
                on_workers[rid] = w.id
                assert r.state in (_RUNNING, _PREEMPTED), f"{rid} on a worker while {r.state}"
        assert self._free == sum(w.free for w in self.workers.values())
        assert self._held == sum(w.held for w in self.workers.values())
        for rid, r in self._reqs.items():
            assert r.state in (_QUEUED, _RUNNING, _PREEMPTED), f"{rid} live while {r.state}"
            if r.state is _QUEUED:
                queued[r.cls] += 1
                assert rid not in on_workers, f"{rid} both queued and running"
            else:
                assert on_workers.get(rid) == r.worker, f"{rid} not on its worker"
                assert rid in self._running[r.cls]
            if r.claimed_for is not None:
                incoming[r.claimed_for] += 1
        assert len(on_workers) == sum(len(d) for d in self._running)
        assert queued == self.lanes.class_count, (queued, self.lanes.class_count)
        assert incoming == self._incoming, (incoming, self._incoming)
