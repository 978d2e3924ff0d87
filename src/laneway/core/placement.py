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

import math
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from laneway.core.prefix_cache import PrefixIndex
from laneway.core.request import Request
from laneway.core.workers import WorkerState

if TYPE_CHECKING:
    from laneway.core.isolation import Isolation


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
    ``prefix`` (the configuration's default) the same, a request whose prompt its worker
    still prefills (until its first token: the tokens not found cached there) counting as
    one more running request for every :data:`PREFILL_TOKENS_A_SLOT` tokens of it (so two
    new prompts go to two engines, not both to the idle one to share its compute), and
    among equals the one whose prefix cache is the least full; unless a worker likely
    holds at least half of the request's prompt in its prefix cache
    (:class:`~laneway.core.prefix_cache.PrefixIndex`) and costs no more there than on the
    least loaded (the requests each runs, and the part of its prompt each would prefill:
    :meth:`_ahead`): then the one that holds the most. Work of
    a class that ``patient`` marks (throughput-bound: by default the preemptible ones, the
    batch classes) weighs affinity more: it goes where its prompt is while that worker has
    a free slot.
    ``round-robin`` takes them in turn (configuration order, the one after the last
    chosen first), whatever they run. Scorers, where given, rank before it.

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
    ) -> None:
        if spread not in SPREADS:
            raise ValueError(f"unknown spread {spread!r} (one of: {', '.join(SPREADS)})")
        self.workers = list(workers)
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        self.spread = spread
        self.patient = tuple(patient)  # per class rank: whether it weighs affinity more
        # workers that run urgent work alone: a filter, and how loaded a worker is to urgent work
        self.isolation = isolation
        if isolation is not None:
            self.filters = (*self.filters, isolation)
        by_isolation: tuple[Scorer, ...] = (isolation, _Kind(isolation)) if isolation is not None else ()
        self._load_scorers = (*self.scorers, *by_isolation, _LOAD)
        self._turn = 0  # round-robin: where the next turn starts in self.workers
        # prefix: what each worker's prefix cache likely holds
        self.index: PrefixIndex | None = (
            PrefixIndex({w.id: w.spec.kv_tokens for w in self.workers}) if spread == "prefix" else None
        )
        self._index = {w.id: i for i, w in enumerate(self.workers)}
        # workers with a free slot, the one idle longest first
        self._free: deque[WorkerState] = deque(w for w in self.workers if w.free > 0)
        self.down: set[str] = set()  # workers out of placement until they recover
        # every worker serves every model and class, and nothing ranks them
        self._open = not self.scorers and all(
            w.spec.models is None and w.spec.classes is None and not w.spec.isolate for w in self.workers
        )
        # one slot each: every candidate runs nothing, the one idle longest is least loaded
        self._single = all(w.spec.slots == 1 for w in self.workers)

    def take_slot(self, req: Request, now: float) -> WorkerState | None:
        free = self._free
        if not free:
            return None
        index = self.index
        matched = -1  # (how many of its prompt's blocks the chosen worker holds, where known)
        if self.spread == "round-robin":
            got = choose(req, self._in_turn(), self.filters, self.scorers, now)
        elif index is not None and req.prefix and len(free) > 1 and not self.scorers:
            got, matched = self._by_prefix(req, index, now)
        elif self._open and (self._single or len(free) == 1):
            got = free[0]
        else:
            got = choose(req, free, self.filters, self._load_scorers, now)
        if got is None:
            return None
        w = got
        if self.spread == "round-robin":
            self._turn = self._index[w.id] + 1
        if index is not None and req.prefix:
            if not req.prefilled:  # what it likely prefills there, until its first token
                if matched < 0:
                    matched = index.matched(w.id, req.prefix)
                req.prefill_left = max(req.prompt_tokens - matched * index.block_tokens, 0)
            index.record(w.id, req.prefix)
        self.take(w)
        return w

    def _by_prefix(self, req: Request, index: PrefixIndex, now: float) -> tuple[WorkerState | None, int]:
        """The least loaded candidate, or the one holding most of the prompt if that is at
        least half of it and the request costs no more there (:meth:`_prefers`); with how
        many of the prompt's blocks the one chosen holds."""
        least: WorkerState | None = None
        least_key: tuple[float, ...] = (math.inf,)
        least_blocks = 0
        iso = self.isolation
        best: WorkerState | None = None
        best_blocks = 0
        blocks = req.prefix
        for w in self._free:
            for f in self.filters:
                if not f.fits(req, w, now):
                    break
            else:
                # least loaded, a prompt it still prefills weighing as more running requests;
                # among equals the one whose cache is fullest the least (so that prompts new
                # to all spread over the caches), then the one idle longest
                key: tuple[float, ...] = (_prefill_load(w), index.held(w.id) / index.capacity(w.id))
                if iso is not None:  # (urgent work: what it would stop there counts as free)
                    key = (iso.score(req, w, now), iso.kind(req, w, now), *key)
                m = index.matched(w.id, blocks)
                if key < least_key:
                    least, least_key, least_blocks = w, key, m
                if m > best_blocks:
                    best, best_blocks = w, m
        if best is None or least is None or best is least or 2 * best_blocks < len(blocks):
            return least, least_blocks
        if iso is None:
            busy, least_busy = best.usable - best.free, least.usable - least.free
        else:
            busy, least_busy = iso.busy(req, best), iso.busy(req, least)
        ahead = self._ahead(req, index, busy, best_blocks)
        if self._prefers(req, ahead, self._ahead(req, index, least_busy, least_blocks)):
            return best, best_blocks
        return least, least_blocks

    def holder_of(self, req: Request) -> str | None:
        w, _ = self._holder(req)
        return w.id if w is not None else None

    def would_take(self, req: Request, now: float) -> WorkerState | None:
        """The worker holding ``req``'s prompt if it has no free slot but would be chosen
        with one freed while another worker has one (where urgent work stops batch work
        for its cache: :mod:`laneway.core.affinity`); ``None``: placement goes on as it
        is (that worker has a free slot, no other has, or it is not worth it)."""
        if self.isolation is not None or len(self._free) == 0:
            return None
        best, best_blocks = self._holder(req)
        # (a worker whose cap withholds the slots its requests leave would not free one)
        if best is None or best.free > 0 or best.usable <= 0 or best.cap_debt > 0:
            return None
        least = choose(req, self._free, self.filters, (_LOAD,), now)
        index = self.index
        if least is None or index is None:
            return None
        ahead = self._ahead(req, index, best.usable - 1, best_blocks)
        least_busy = least.usable - least.free
        least_ahead = self._ahead(req, index, least_busy, index.matched(least.id, req.prefix))
        return best if self._prefers(req, ahead, least_ahead) else None

    def _holder(self, req: Request) -> tuple[WorkerState | None, int]:
        """The worker in service for ``req`` likely to hold most of its prompt, if at
        least half of it, and how many of the prompt's blocks it holds."""
        index = self.index
        blocks = req.prefix
        if index is None or not blocks:
            return None, 0
        best: WorkerState | None = None
        best_blocks = 0
        for w in self.workers:
            spec = w.spec
            if w.id in self.down or not spec.serves(req.model) or not spec.admits(req.cls):
                continue
            m = index.matched(w.id, blocks)
            if m > best_blocks:
                best, best_blocks = w, m
        return (best, best_blocks) if 2 * best_blocks >= len(blocks) else (None, 0)

    @staticmethod
    def _ahead(req: Request, index: PrefixIndex, busy: int, matched: int) -> float:
        """What ``req`` would cost on a worker, in running requests: the ``busy`` ones there,
        and the part of its prompt not likely cached there (``matched`` blocks are) as one
        more for every :data:`PREFILL_TOKENS_A_SLOT` tokens. (Prompts others still prefill
        there are not counted: they pass in seconds, where a miss copies the prompt into
        a second cache, evicting others' — in the simulator counting them cost about a
        point of hit rate and 3-6 % of the agents' mean time to first token.)"""
        block = index.block_tokens
        own = max(max(req.prompt_tokens, len(req.prefix) * block) - matched * block, 0)
        return busy + own / PREFILL_TOKENS_A_SLOT

    def _prefers(self, req: Request, ahead: float, least_ahead: float) -> bool:
        """Whether ``req`` goes to the worker holding most of its prompt, where it would
        cost ``ahead`` running requests (:meth:`_ahead`), rather than to the least loaded
        candidate, where ``least_ahead``: a throughput-bound request always, else if it
        costs no more there (the prefill its cache saves weighs as the requests it would
        run beside)."""
        patient = req.preemptible and req.cls < len(self.patient) and self.patient[req.cls]
        return patient or ahead <= least_ahead

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


def _load(w: WorkerState) -> float:
    """The share of the slots it may use that a worker runs (held slots count)."""
    usable = w.usable
    return 1.0 - w.free / usable if usable > 0 else 1.0


# A request whose prompt its worker still prefills weighs one more running request there
# for every PREFILL_TOKENS_A_SLOT tokens of it left to prefill: a prefill is compute-bound
# and shares the engine with a new one, where a decoding request costs it little
# (measured on vLLM's CPU engines of SmolLM2: a 1,337-token prefill took 13 s beside
# another where alone it took 6.7 s; beside a decoding request 1.14-1.22x).
PREFILL_TOKENS_A_SLOT = 256


def _prefill_load(w: WorkerState) -> float:
    """:func:`_load` with the prompts its requests still prefill counted as more of them."""
    load = _load(w)
    return load + w.prefill / (PREFILL_TOKENS_A_SLOT * w.usable) if w.prefill else load


class LeastLoaded:
    """The share of its usable slots a worker runs (held slots count): the lowest wins."""

    def score(self, req: Request, w: WorkerState, now: float) -> float:
        return _load(w)


_LOAD = LeastLoaded()


class _Kind:
    """Isolated workers: the kind of worker a request goes to among equals (a scorer)."""

    def __init__(self, isolation: Isolation) -> None:
        self.score = isolation.kind
