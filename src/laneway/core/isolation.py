"""Workers that run urgent work alone (``isolate``): no batch work beside it.

On an engine whose requests share one compute budget — a CPU engine, llama.cpp on a
laptop, an engine whose batch prefills stall its decodes — every request added slows the
others in proportion: a batch request running beside an urgent one takes its compute and
its KV space. laneway's classes decide *when* work starts; on such a worker they must
also decide *what runs together*. A worker marked ``isolate`` keeps them apart:

- a request does not start there beside a running request of a class that may preempt
  its class, nor for ``hold_s`` after one ended there (its client's next step most often
  comes within it), nor in its last free slot: that one is kept for urgent work, so that
  urgent work finds a slot on every such worker;
- a request that starts there stops the running ones it may preempt (those that may be
  stopped: preemptible, not claimed by another class, their preemptions not spent), by
  checkpoint or recompute as any preemption; they resume where they stopped, there once
  the worker is quiet, or elsewhere.

Urgent work is spread over such workers by what it would not stop there: a P0 goes to a
worker running only batch work (which stops) before one running another P0, so that
urgent requests share an engine only once each engine runs one.

Urgent work never waits for it: the rule only keeps less urgent work off a worker. The
cost is batch throughput on that worker while urgent work comes; on an engine that
batches requests almost free (a GPU decoding), leave it off.

A wait estimate of the work it keeps off counts it (:mod:`laneway.core.estimator`): the
slots kept now, when a quiet time ends, and, for the queue ahead, the slots kept from the
class over about the last minute (:meth:`Isolation.observe`, at each scheduling step of a
policy that stops work).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from laneway.core.decisions import Decision
from laneway.core.request import Request, State
from laneway.core.workers import WorkerState

if TYPE_CHECKING:
    from laneway.core.preemption import Preemptor

_RUNNING = State.RUNNING
KEPT_WINDOW_S = 60.0  # the slots kept from a class are averaged over about this long


class Isolation:
    """The placement filter and the stops of isolated workers (:mod:`laneway.core.isolation`).

    ``rights_of``: per class, the classes it may preempt (its row of the table: what keeps
    off beside it, a class that may not be preempted included); ``victims``: of those, the
    ones that may be preempted (what it stops)."""

    __slots__ = (
        "_keepers",
        "_kept_avg",
        "_seen_s",
        "_weight",
        "exposed",
        "hold_s",
        "rights_of",
        "slots",
        "started",
        "stops",
        "urgent",
        "victims",
        "workers",
    )

    def __init__(
        self,
        rights_of: Sequence[frozenset[int]],
        victims: Sequence[tuple[int, ...]],
        hold_s: float,
        workers: Sequence[WorkerState],
        stops: bool = True,
    ) -> None:
        self.rights_of = tuple(rights_of)
        self.victims = tuple(frozenset(v) for v in victims)
        self.exposed = frozenset(c for r in rights_of for c in r)  # the classes some class outranks
        self.urgent = tuple(bool(r) for r in rights_of)  # per class: whether it keeps some class off
        self.hold_s = hold_s
        self.stops = stops  # (whether the policy preempts at all)
        self.workers = [w for w in workers if w.spec.isolate]
        self.slots = sum(w.spec.slots for w in self.workers)  # (of the isolated workers)
        # urgent starts on isolated workers since the last stop step: (request, worker)
        self.started: list[tuple[Request, WorkerState]] = []
        # per class: the isolated slots kept from it, on average over the last minutes
        # (:meth:`observe`), and what kept them at the last look: (slots, kept until)
        self._kept_avg = [0.0] * len(self.rights_of)
        self._weight = 0.0  # (of the average: 1 once it has seen many minutes)
        self._keepers: list[list[tuple[int, float]]] = [[] for _ in self.rights_of]
        self._seen_s = math.nan

    # ------------------------------------------------------------------ the filter
    def fits(self, req: Request, w: WorkerState, now: float) -> bool:
        return not w.spec.isolate or self.admits(req.cls, w, now)

    def admits(self, cls: int, w: WorkerState, now: float) -> bool:
        """Whether a request of class ``cls`` may start on isolated worker ``w`` now."""
        if cls not in self.exposed:
            return True
        if w.free <= 1 and w.usable > 1:
            return False  # (its last free slot is kept for the work that outranks this)
        rights = self.rights_of
        if w.calm and any(until > now and cls in rights[u] for u, until in w.calm.items()):
            return False
        return not any(cls in rights[r.cls] for r in w.running.values() if r.state is _RUNNING)

    def ever(self, req: Request, w: WorkerState) -> bool:
        return True

    def why_never(self, req: Request) -> str:  # (never: ``ever`` holds)
        return ""

    # ------------------------------------------------------------------ load, as urgent work sees it
    def busy(self, req: Request, w: WorkerState) -> int:
        """The slots of ``w`` in use that ``req`` would not free by starting there (on an
        isolated worker, what it may stop does not count)."""
        n = w.usable - w.free
        if w.spec.isolate and self.stops:
            mine = self.victims[req.cls]
            if mine:
                n -= sum(1 for r in w.running.values() if r.cls in mine and r.state is _RUNNING)
        return n

    def score(self, req: Request, w: WorkerState, now: float) -> float:
        """A scorer: the share of its slots ``w`` runs that ``req`` would not stop."""
        usable = w.usable
        return self.busy(req, w) / usable if usable > 0 else 1.0

    def suits(self, req: Request, w: WorkerState) -> bool:
        """Whether ``w`` is the kind of worker ``req`` goes to among equals: urgent work to
        an isolated worker (nothing will start beside it there), other work to one not."""
        return w.spec.isolate == self.urgent[req.cls]

    def kind(self, req: Request, w: WorkerState, now: float) -> float:
        """A scorer, after :meth:`score`: 0 for the kind of worker ``req`` goes to among
        equals (:meth:`suits`), else 1."""
        return 0.0 if self.suits(req, w) else 1.0

    def kept_from(self, cls: int, now: float) -> int:
        """Free slots of isolated workers that a request of class ``cls`` may not take now
        (an estimate does not count them as free for it)."""
        if cls not in self.exposed:
            return 0
        return sum(w.free for w in self.workers if w.free > 0 and not self.admits(cls, w, now))

    # ------------------------------------------------------------------ how much it keeps off
    def observe(self, now: float) -> None:
        """Count the slots kept from each class since the last look, and note what keeps
        them now (at each scheduling step): a worker keeps a class off while work that
        outranks it runs there (until an event), or until its quiet time ends."""
        last = self._seen_s
        if last == last and now > last:  # (not NaN: a look before)
            dt = now - last
            decay = math.exp(-dt / KEPT_WINDOW_S)
            for c in self.exposed:
                slot_s = sum(n * (min(until, now) - last) for n, until in self._keepers[c] if until > last)
                self._kept_avg[c] = self._kept_avg[c] * decay + slot_s / dt * (1.0 - decay)
            self._weight = self._weight * decay + (1.0 - decay)
        if last != last or now >= last:  # (again at the same instant: what a later step started)
            self._seen_s = now
            rights = self.rights_of
            exposed = self.exposed
            keepers = self._keepers
            for c in exposed:
                keepers[c].clear()
            for w in self.workers:  # (each class's keepers in the workers' order)
                slots = w.spec.slots
                kept: frozenset[int] = frozenset()
                for r in w.running.values():  # (the classes kept off while it runs)
                    if r.state is _RUNNING:
                        kept |= rights[r.cls]
                for c in kept:
                    keepers[c].append((slots, math.inf))
                if w.calm:
                    for c in exposed - kept:
                        until = max((t for u, t in w.calm.items() if t > now and c in rights[u]), default=now)
                        if until > now:
                            keepers[c].append((slots, until))

    def kept_share(self, cls: int) -> float:
        """The share of the isolated workers' slots kept from class ``cls`` on average over
        the last minutes (0 before any look)."""
        if not self.slots or self._weight <= 0.0:
            return 0.0
        return min(self._kept_avg[cls] / self._weight / self.slots, 1.0)

    # ------------------------------------------------------------------ events
    def start(self, req: Request, w: WorkerState) -> None:
        """``req`` started on ``w``: if it may preempt anyone, those beside it stop at the
        next :meth:`separate`."""
        if self.stops and w.spec.isolate and self.victims[req.cls] and len(w.running) > 1:
            self.started.append((req, w))

    def ended(self, req: Request, w: WorkerState, now: float) -> None:
        """``req`` ended on ``w`` at ``now``: what its class outranks keeps off ``w`` for
        ``hold_s``."""
        if w.spec.isolate and self.hold_s > 0 and self.urgent[req.cls]:
            w.calm[req.cls] = now + self.hold_s

    def separate(self, preemptor: Preemptor, now: float, out: list[Decision]) -> None:
        """Stop what each urgent request started on an isolated worker runs beside."""
        started, self.started = self.started, []
        for req, w in started:
            if req.state is not _RUNNING or req.worker != w.id:
                continue
            mine = self.victims[req.cls]
            for r in [r for r in w.running.values() if r.cls in mine]:
                if preemptor.may_stop(r, now):
                    preemptor.stop(r, preemptor.cheapest_mode(r, now), req.cls, now, out)

    def next_calm(self, now: float) -> float:
        """When the next quiet time of an isolated worker ends (inf: none pending)."""
        return min((t for w in self.workers for t in w.calm.values() if t > now), default=math.inf)
