"""Who runs where: the workers and their slots — free, running, held for use elsewhere —
the running requests by class with the sum of their expected ends (and of those that may
not be preempted), and a count of every
time a slot changes hands (victim searches that found nothing look again only after it
moved).

:class:`Occupancy` is the one owner of these figures; a slot is taken and freed through
the placement (:mod:`laneway.core.placement`), which chooses the worker and keeps its own
order of free workers.
"""

from __future__ import annotations

from collections.abc import Sequence

from laneway.core.errors import LanewayError
from laneway.core.placement import Placement
from laneway.core.request import Request
from laneway.core.workers import WorkerSpec, WorkerState


class Occupancy:
    __slots__ = (
        "changes",
        "end_sum",
        "exposed_running",
        "fixed",
        "fixed_end_sum",
        "free",
        "held",
        "placement",
        "running",
        "slots",
        "workers",
    )

    def __init__(
        self, workers: dict[str, WorkerState], placement: Placement, k: int, exposed: Sequence[int]
    ) -> None:
        self.workers = workers
        self.placement = placement
        self.slots = sum(w.spec.slots for w in workers.values())
        self.free = self.slots
        self.held = 0  # slots held for use outside the scheduler (hold)
        self.running: list[dict[str, Request]] = [{} for _ in range(k)]  # by class, start order
        self.end_sum = [0.0] * k  # sum of expected ends of running work, by class
        # of those, the requests that may not be preempted (``preemptible`` false), by class
        self.fixed = [0] * k
        self.fixed_end_sum = [0.0] * k
        self.changes = 0  # bumped whenever a slot changes hands
        # the running requests of the classes some class may preempt: with none of them
        # running, no preemption is possible
        self.exposed_running = tuple(self.running[v] for v in exposed)

    # ------------------------------------------------------------------ slots
    def prefilled(self, req: Request) -> None:
        """``req`` made its first token: its prompt is prefilled (its worker's pending
        prefill no longer counts it)."""
        req.prefilled = True
        if req.prefill_left and req.worker is not None:
            _prefill_done(req, self.workers[req.worker])

    def start(self, req: Request, w: WorkerState, now: float) -> None:
        """``req`` runs on ``w`` (whose slot the placement took) from ``now``."""
        self.changes += 1
        cls = req.cls
        left = req.est_s - req.run_s
        if left < 0.0:  # max(left, 0.0) without the call
            left = 0.0
        req.expected_end_s = now + left
        req.worker = w.id
        w.running[req.id] = req
        w.prefill += req.prefill_left
        self.free -= 1
        self.running[cls][req.id] = req
        self._count(req, cls, 1)

    def release(self, req: Request) -> None:
        """Free the slot held by a running or preempted request."""
        w = self.workers[req.worker]  # type: ignore[index]
        rid = req.id
        cls = req.cls
        self.changes += 1
        del w.running[rid]
        if req.prefill_left:
            _prefill_done(req, w)
        if w.cap_debt and req.claimed_for is None:  # its cap was lowered: the slot is withheld
            # (a slot freed for a claimant, by a preemption, goes to it all the same)
            w.cap_debt -= 1
            w.capped += 1
        else:
            self.free += 1
            self.placement.free_slot(w)
        del self.running[cls][rid]
        self._count(req, cls, -1)
        req.worker = None

    def adoptable(self, worker_id: str, request_id: str) -> WorkerState:
        """The worker a request found running on ``worker_id`` would be taken in on (or why
        not: unknown, not slot placement, no free slot)."""
        w = self._worker(worker_id, "running requests can be taken in")
        if w.free <= 0:
            raise LanewayError(f"worker {worker_id} has no free slot for {request_id}")
        return w

    def adopt(self, req: Request, w: WorkerState, now: float) -> None:
        """``req`` (its class and expected service set) is found running on ``w``
        (:meth:`adoptable`) already: it holds one of the worker's slots from ``now``."""
        self.placement.take(w)
        req.worker = w.id
        w.running[req.id] = req
        self.free -= 1
        self.running[req.cls][req.id] = req
        req.expected_end_s = now + max(req.est_s - req.run_s, 0.0)
        self._count(req, req.cls, 1)
        self.changes += 1

    def hold(self, worker_id: str, n: int) -> None:
        """Hold ``n`` slots of ``worker_id`` (in all, not more) out of the scheduler's hands."""
        w = self._worker(worker_id, "slots can be held")
        if n < 0:
            raise LanewayError(f"cannot hold {n} slots")
        more = n - w.held
        if more > w.free:
            raise LanewayError(f"worker {worker_id} has {w.free} free slots, not {more}")
        for _ in range(more):
            self.placement.take(w)
        for _ in range(-more):
            self.placement.free_slot(w)
        w.held = n
        self.free -= more
        self.held += more
        self.changes += 1

    def set_slots(self, worker_id: str, n: int) -> None:
        """``worker_id`` may use ``n`` of its slots (1 to all of them): free ones are withheld
        at once, running ones as they end (none is stopped); raising it frees them again."""
        w = self._worker(worker_id, "slots can be capped")
        if not 1 <= n <= w.spec.slots:
            raise LanewayError(f"worker {worker_id}: {n} slots is not 1 to {w.spec.slots}")
        more = (w.spec.slots - n) - (w.capped + w.cap_debt)
        if more > 0:
            now = min(more, w.free)
            for _ in range(now):
                self.placement.take(w)
            w.capped += now
            self.free -= now
            w.cap_debt += more - now
        elif more < 0:
            back = -more
            cancel = min(back, w.cap_debt)
            w.cap_debt -= cancel
            for _ in range(back - cancel):
                self.placement.free_slot(w)
            w.capped -= back - cancel
            self.free += back - cancel
        self.changes += 1

    def _worker(self, worker_id: str, what: str) -> WorkerState:
        w = self.workers.get(worker_id)
        if w is None:
            raise LanewayError(f"unknown worker {worker_id!r}")
        if not self.placement.takes_any:
            raise LanewayError(f"{what} only with slot placement")
        return w

    # ------------------------------------------------------------------ workers that come and go
    def add(self, w: WorkerState) -> None:
        """A worker joins (a replica loaded on GPUs): its slots take work from now on."""
        self.workers[w.id] = w
        self.free += w.free
        self.slots += w.spec.slots
        self.changes += 1

    def remove(self, worker_id: str) -> WorkerState:
        """A worker leaves (an idle replica evicted)."""
        w = self.workers.pop(worker_id)
        self.free -= w.free
        self.slots -= w.spec.slots
        self.changes += 1
        return w

    # ------------------------------------------------------------------ classes and ends
    def reclass(self, req: Request, target: int) -> None:
        """Running ``req`` counts as class ``target`` from now on (inheritance)."""
        run = self.running[req.cls].pop(req.id)
        self._count(req, req.cls, -1)
        req.cls = target
        self.running[target][req.id] = run
        self._count(req, target, 1)

    def expect_end(self, req: Request, end: float) -> None:
        """Running ``req`` is expected to end at ``end`` now (its pace is known)."""
        delta = end - req.expected_end_s  # (by the difference: the sums as they were added)
        self.end_sum[req.cls] += delta
        if not req.preemptible:
            self.fixed_end_sum[req.cls] += delta
        req.expected_end_s = end

    def _count(self, req: Request, cls: int, sign: int) -> None:
        """Running ``req`` counted in (``sign`` 1) or out of (-1) class ``cls``'s sums."""
        end = sign * req.expected_end_s
        self.end_sum[cls] += end
        if not req.preemptible:
            self.fixed[cls] += sign
            self.fixed_end_sum[cls] += end

    # ------------------------------------------------------------------ checks
    def check(self) -> dict[str, str]:
        """Assert the slot books agree; every request on a worker -> its worker."""
        assert self.slots == sum(w.spec.slots for w in self.workers.values())
        on_workers: dict[str, str] = {}
        for w in self.workers.values():
            assert 0 <= w.free == w.spec.slots - len(w.running) - w.held - w.capped, (
                f"worker {w.id} slot count"
            )
            assert w.held >= 0, f"worker {w.id} holds {w.held}"
            assert w.capped >= 0 and w.cap_debt >= 0 and w.usable >= 1, f"worker {w.id} cap"
            assert w.prefill == sum(r.prefill_left for r in w.running.values()), f"worker {w.id} prefill"
            for rid in w.running:
                assert rid not in on_workers, f"{rid} on two workers"
                on_workers[rid] = w.id
        assert self.free == sum(w.free for w in self.workers.values())
        assert self.held == sum(w.held for w in self.workers.values())
        assert len(on_workers) == sum(len(d) for d in self.running)
        assert self.fixed == [sum(not r.preemptible for r in d.values()) for d in self.running]
        return on_workers


def _prefill_done(req: Request, w: WorkerState) -> None:
    """``req``'s prompt no longer counts as prefill ahead on ``w``."""
    w.prefill -= req.prefill_left
    req.prefill_left = 0


def worker_states(specs: Sequence[WorkerSpec]) -> dict[str, WorkerState]:
    workers = {spec.id: WorkerState(spec) for spec in specs}
    if len(workers) != len(specs):
        raise LanewayError("worker ids must be unique")
    return workers
