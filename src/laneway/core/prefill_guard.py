"""An urgent request's long prefill runs with no other long prefill beside it.

On an engine whose requests share one compute budget (vLLM on a CPU), a request that has
to prefill its whole prompt — an agent's turn whose prompt the engine does not hold —
reaches its first token in proportion to the prefill work beside it: decodes beside it
cost it next to nothing, other prompts being prefilled all (on vLLM's CPU build with
SmolLM2, a ~700-token prompt took 2.0 s alone, 2.0 s beside three decodes, 3.1 s beside
one ~400-token prefill, 4.1 s beside two).

So, under placement by prefix, while an urgent request prefills at least
:data:`GUARD_TOKENS` on a worker (it *guards* it, until its first token):

- the batch requests there still prefilling stop (they resume later, there or
  elsewhere) — the ones it may preempt, as any preemption;
- no work of a class it may preempt starts there;
- no other urgent request that would prefill as much there starts there: it starts where
  it would not crowd a guarded prefill (stopping batch work there, or waiting for a guard
  to end: prefills one after the other reach their first tokens sooner on average than
  side by side); urgent work whose prompt that worker holds starts there as before.

The guard ends with the guarding request's first token (or its run), and the scheduler
steps then.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from laneway.core.decisions import Decision
from laneway.core.request import Request, State
from laneway.core.workers import WorkerState

if TYPE_CHECKING:
    from laneway.core.preemption import Preemptor
    from laneway.core.prefix_cache import PrefixIndex

_RUNNING = State.RUNNING
GUARD_TOKENS = 256  # an urgent request prefilling at least this many prompt tokens guards its worker


class PrefillGuard:
    """The workers an urgent prefill guards (:mod:`laneway.core.prefill_guard`): a
    placement filter, and the stops it makes."""

    __slots__ = ("guards", "index", "started", "victims")

    def __init__(self, victims: Sequence[tuple[int, ...]]) -> None:
        self.victims = tuple(frozenset(v) for v in victims)  # per class: the classes it may stop
        self.index: PrefixIndex | None = None  # (the placement's, set once it is built)
        self.guards: dict[str, Request] = {}  # worker id -> the urgent request prefilling there
        self.started: list[Request] = []  # guards begun since the last stop step

    def guard_of(self, w: WorkerState) -> Request | None:
        """The urgent request prefilling on ``w`` (``None``: none; a guard over is dropped)."""
        g = self.guards.get(w.id)
        if g is None:
            return None
        if g.state is _RUNNING and g.worker == w.id and not g.prefilled:
            return g
        del self.guards[w.id]
        return None

    def _prefills(self, req: Request, w: WorkerState) -> int:
        """The prompt tokens ``req`` would likely prefill on ``w``."""
        index = self.index
        if index is None or not req.prefix:
            return req.prompt_tokens
        return max(req.prompt_tokens - index.matched(w.id, req.prefix) * index.block_tokens, 0)

    # ------------------------------------------------------------------ the filter
    def fits(self, req: Request, w: WorkerState, now: float) -> bool:
        if not self.guards:
            return True
        g = self.guard_of(w)
        if g is None or g is req:
            return True
        if req.cls in self.victims[g.cls]:
            return False  # (work it may stop: kept off while it prefills)
        return not self.victims[req.cls] or self._prefills(req, w) < GUARD_TOKENS

    def ever(self, req: Request, w: WorkerState) -> bool:
        return True

    def why_never(self, req: Request) -> str:  # (never: ``ever`` holds)
        return ""

    # ------------------------------------------------------------------ events
    def start(self, req: Request, w: WorkerState) -> None:
        """``req`` started on ``w`` (its prefill there estimated): urgent and prefilling at
        least :data:`GUARD_TOKENS`, it guards ``w``."""
        if self.victims[req.cls] and req.prefill_left >= GUARD_TOKENS and self.guard_of(w) is None:
            self.guards[w.id] = req
            self.started.append(req)

    def separate(
        self, preemptor: Preemptor, workers: dict[str, WorkerState], now: float, out: list[Decision]
    ) -> None:
        """Stop the batch requests still prefilling beside each guard begun since the last
        call."""
        started, self.started = self.started, []
        for g in started:
            w = workers.get(g.worker) if g.worker is not None else None
            if w is None or self.guard_of(w) is not g:
                continue
            mine = self.victims[g.cls]
            for r in [r for r in w.running.values() if r.cls in mine and r.prefill_left > 0]:
                if preemptor.may_stop(r, now):
                    preemptor.stop(r, preemptor.cheapest_mode(r, now), g.cls, now, out)

    def ends(self, req: Request) -> bool:
        """Whether ``req`` (its first token came) guarded a worker: the guard ends, and
        what it kept off may start."""
        w = req.worker
        if w is not None and self.guards.get(w) is req:
            del self.guards[w]
            return True
        return False
