"""Where a request runs: filter, then score (the Kubernetes scheduler framework's shape).

A placement answers three questions for the scheduler:

- :meth:`Placement.take_slot`: *this worker* (its slot taken), or ``None``: *not now*
  (wait; a load or a preemption may help);
- :meth:`Placement.never`: why no worker could *ever* run the request (it is refused at
  once), or ``None``;
- :meth:`Placement.free_slot` / :meth:`Placement.set_available`: a slot came free, a
  worker went out of service or came back.

Work is spread over the workers that may take it (``[scheduler] placement``): where its
prompt is likely in the prefix cache (``prefix``, the default), else to the one running
the smallest share of its slots (so two engines of four slots each run two and two, not
four and none; ``least-loaded``), or in turn (``round-robin``).

Both placements, :class:`SlotPlacement` (workers of fixed slots: the server's upstreams
and engines, the simulator's slots) and :class:`~laneway.core.gpu_placement.GpuPlacement`
(replicas of models that it loads on GPUs), choose among the workers that could take a
request with one pipeline, :func:`choose`: each :class:`Filter` says whether a worker may
take it (now, and ever), each :class:`Scorer` ranks those that may, the lowest score
winning and ties going to the placement's own order (the worker idle longest; the
replica listed first). A new rule — the prefix cache a worker likely holds, an engine's
own load — is one filter or scorer added to a placement's list.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from laneway.core.prefix_cache import PrefixIndex
from laneway.core.prefix_spread import PrefixSpread
from laneway.core.request import Request
from laneway.core.slot_load import SLOT_SHARE
from laneway.core.workers import WorkerState

if TYPE_CHECKING:
    from laneway.core.isolation import Isolation
    from laneway.core.prefill_guard import PrefillGuard


class Filter(Protocol):
    """A rule a worker must pass to take a request."""

    def fits(self, req: Request, w: WorkerState, now: float) -> bool:
        """Whether ``w`` may take ``req`` now."""
        ...

    def ever(self, req: Request, w: WorkerState) -> bool:
        """Whether ``w`` could take ``req`` at some time (``False``: never)."""
        ...

    def why_never(self, req: Request) -> str:
        """Why no worker that passed the filters before this one could ever take ``req``."""
        ...


class Scorer(Protocol):
    """Ranks the workers that passed every filter: the lowest score wins."""

    def score(self, req: Request, w: WorkerState, now: float) -> float: ...


def choose(
    req: Request,
    candidates: Iterable[WorkerState],
    filters: Sequence[Filter],
    scorers: Sequence[Scorer],
    now: float,
) -> WorkerState | None:
    """The candidate (in the placement's order) that passes every filter with the lowest
    scores, compared scorer by scorer; the first of equals. ``None``: none passes."""
    best: WorkerState | None = None
    best_key: tuple[float, ...] = ()
    for w in candidates:
        for f in filters:
            if not f.fits(req, w, now):
                break
        else:
            if not scorers:
                return w
            key = tuple(s.score(req, w, now) for s in scorers)
            if best is None or key < best_key:
                best, best_key = w, key
    return best


def never(req: Request, workers: Sequence[WorkerState], filters: Sequence[Filter]) -> str | None:
    """Why no worker could ever take ``req``: the first filter that none of those passing
    the filters before it could ever pass; ``None``: some worker could."""
    for f in filters:
        workers = [w for w in workers if f.ever(req, w)]
        if not workers:
            return f.why_never(req)
    return None


# ---------------------------------------------------------------------- filters
class ServesModel:
    """The worker serves the request's model (a worker of no model list serves any)."""

    def fits(self, req: Request, w: WorkerState, now: float) -> bool:
        return w.spec.serves(req.model)

    def ever(self, req: Request, w: WorkerState) -> bool:
        return w.spec.serves(req.model)

    def why_never(self, req: Request) -> str:
        return f"no worker serves model {req.model!r}"


class AdmitsClass:
    """The worker runs the request's class (GPUs reserved for some classes): its effective
    class now, its own class for "ever" (inheritance may raise it, never lower it)."""

    def fits(self, req: Request, w: WorkerState, now: float) -> bool:
        return w.spec.admits(req.cls)

    def ever(self, req: Request, w: WorkerState) -> bool:
        return w.spec.admits(req.priority)

    def why_never(self, req: Request) -> str:
        return f"no worker serving model {req.model!r} may run class rank {req.priority}"


# ---------------------------------------------------------------------- the protocol
class Placement(Protocol):
    down: set[str]  # workers out of placement until they recover
    # whether a slot of a chosen worker can be taken (adopt, hold): slot placement only
    takes_any: bool

    def take_slot(self, req: Request, now: float) -> WorkerState | None:
        """A worker with a free slot for ``req`` now, that slot taken
        (``worker.free`` one lower); ``None``: not now."""
        ...

    def take(self, worker: WorkerState) -> None:
        """Take a slot of this very worker (a request found running there, a slot held)."""
        ...

    def never(self, req: Request) -> str | None:
        """Why no worker could ever run ``req``; ``None`` if some could."""
        ...

    def free_slot(self, worker: WorkerState) -> None:
        """A slot of ``worker`` came free (``worker.free`` one higher)."""
        ...

    def set_available(self, worker: WorkerState, available: bool) -> None:
        """Take ``worker`` out of placement (it failed) or back in (it recovered)."""
        ...

    def holder_of(self, req: Request) -> str | None:
        """The worker likely to hold most of ``req``'s prompt in its prefix cache, if at
        least half of it (where to free a slot for it, when one must be freed); ``None``:
        none, or no prefix cache is modelled."""
        ...


# how a slot placement spreads work over workers that may all take it
SPREADS = ("prefix", "least-loaded", "round-robin")


class SlotPlacement:
    """Workers of fixed slots. Candidates: the workers with a free slot and in service;
    filters: it serves the model, it runs the class; scorers: none unless given.

    ``spread`` orders the candidates: ``least-loaded`` takes the one running the smallest
    share of its slots, the one idle longest among equals (configuration order at start);
    ``prefix`` (the configuration's default) the same, with the prompts workers still
    prefill counted as more running requests, unless a worker likely holds at least half
    of the request's prompt in its prefix cache and the request costs no more there
    (:class:`~laneway.core.prefix_spread.PrefixSpread`; work of a class that ``patient``
    marks goes where its prompt is while that worker has a free slot); ``round-robin``
    takes them in turn (configuration order, the one after the last chosen first),
    whatever they run. Scorers, where given, rank before it.

    Only workers with a free slot are candidates: affinity never makes a request wait
    while another worker could start it."""

    takes_any = True

    def __init__(
        self,
        workers: Sequence[WorkerState],
        filters: Sequence[Filter] = (ServesModel(), AdmitsClass()),
        scorers: Sequence[Scorer] = (),
        spread: str = "least-loaded",
        patient: Sequence[bool] = (),
        isolation: Isolation | None = None,
        guard: PrefillGuard | None = None,
    ) -> None:
        if spread not in SPREADS:
            raise ValueError(f"unknown spread {spread!r} (one of: {', '.join(SPREADS)})")
        self.workers = list(workers)
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        self.spread = spread
        # workers that run urgent work alone: a filter, and how loaded a worker is to urgent work
        self.isolation = isolation
        if isolation is not None:
            self.filters = (*self.filters, isolation)
        if guard is not None:  # (urgent long prefills kept apart: laneway.core.prefill_guard)
            self.filters = (*self.filters, guard)
        by_isolation: tuple[Scorer, ...] = (isolation, _Kind(isolation)) if isolation is not None else ()
        self._load_scorers = (*self.scorers, *by_isolation, SLOT_SHARE)
        self._turn = 0  # round-robin: where the next turn starts in self.workers
        # prefix: what each worker's prefix cache likely holds, and placement by it
        self.by_prefix: PrefixSpread | None = None
        self.index: PrefixIndex | None = None
        if spread == "prefix":
            self.index = PrefixIndex({w.id: w.spec.kv_tokens for w in self.workers})
            self.by_prefix = PrefixSpread(self.index, self.filters, patient, isolation)
            if guard is not None:
                guard.index = self.index
        self._index = {w.id: i for i, w in enumerate(self.workers)}
        # workers with a free slot, the one idle longest first
        self._free: deque[WorkerState] = deque(w for w in self.workers if w.free > 0)
        self.down: set[str] = set()  # workers out of placement until they recover
        # every worker serves every model and class, and nothing ranks them (nor, while it
        # guards none, the prefill guard keeps work off one)
        self._open = not self.scorers and all(
            w.spec.models is None and w.spec.classes is None and not w.spec.isolate for w in self.workers
        )
        self.guard = guard
        # one slot each: every candidate runs nothing, the one idle longest is least loaded
        self._single = all(w.spec.slots == 1 for w in self.workers)

    def take_slot(self, req: Request, now: float) -> WorkerState | None:
        free = self._free
        if not free:
            return None
        by_prefix = self.by_prefix
        matched = -1  # (how many of its prompt's blocks the chosen worker holds, where known)
        if self.spread == "round-robin":
            got = choose(req, self._in_turn(), self.filters, self.scorers, now)
        elif by_prefix is not None and req.prefix and len(free) > 1 and not self.scorers:
            got, matched = by_prefix.choose(req, free, now)
        elif self._open and (self._single or len(free) == 1) and not (self.guard and self.guard.guards):
            got = free[0]
        else:
            got = choose(req, free, self.filters, self._load_scorers, now)
        if got is None:
            return None
        w = got
        if self.spread == "round-robin":
            self._turn = self._index[w.id] + 1
        index = self.index
        if index is not None and req.prefix:
            if matched < 0:
                matched = index.matched(w.id, req.prefix)
            req.cached_blocks = matched
            if not req.prefilled:  # what it likely prefills there, until its first token
                req.prefill_left = max(req.prompt_tokens - matched * index.block_tokens, 0)
            index.record(w.id, req.prefix, matched)
        self.take(w)
        return w

    def holder_of(self, req: Request) -> str | None:
        if self.by_prefix is None:
            return None
        w, _ = self.by_prefix.holder(req, self.workers, self.down)
        return w.id if w is not None else None

    def would_take(self, req: Request, now: float) -> WorkerState | None:
        """The worker holding ``req``'s prompt if it has no free slot but would be chosen
        with one freed while another worker has one (where urgent work stops batch work
        for its cache: :mod:`laneway.core.affinity`); ``None``: placement goes on as it
        is (that worker has a free slot, no other has, or it is not worth it)."""
        by_prefix = self.by_prefix
        if by_prefix is None or self.isolation is not None or len(self._free) == 0:
            return None
        return by_prefix.stop_for(req, self.workers, self._free, self.down, now)

    def _in_turn(self) -> list[WorkerState]:
        """The candidates in round-robin order: from the one after the last chosen."""
        n = len(self.workers)
        start = self._turn % n if n else 0
        order = self.workers[start:] + self.workers[:start]
        return [w for w in order if w.free > 0 and w.id not in self.down]

    def never(self, req: Request) -> str | None:
        return never(req, self.workers, self.filters)

    def take(self, worker: WorkerState) -> None:
        worker.free -= 1
        self._touched(worker)

    def free_slot(self, worker: WorkerState) -> None:
        worker.free += 1
        self._touched(worker)

    def _touched(self, worker: WorkerState) -> None:
        """A worker just took or freed a slot: among equals it is now the one idle the
        shortest (the last of ``_free``), or out of ``_free`` if it has no free slot."""
        free = self._free
        if free and free[0] is worker:
            free.popleft()
        elif worker in free:
            free.remove(worker)
        if worker.free > 0 and worker.id not in self.down:
            free.append(worker)

    def set_available(self, worker: WorkerState, available: bool) -> None:
        if available:
            self.down.discard(worker.id)
            if worker.free > 0 and worker not in self._free:
                self._free.append(worker)
        else:
            self.down.add(worker.id)
            if worker in self._free:
                self._free.remove(worker)


class _Kind:
    """Isolated workers: the kind of worker a request goes to among equals (a scorer)."""

    def __init__(self, isolation: Isolation) -> None:
        self.score = isolation.kind
