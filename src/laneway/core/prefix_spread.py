"""Placement by prefix: a request goes where its prompt is likely cached, when that saves
more prefill than the requests it would run beside there cost it.

:class:`PrefixSpread` is the ``prefix`` spread of a
:class:`~laneway.core.placement.SlotPlacement` (the configuration's default): among the
workers with a free slot, the least loaded (:func:`~laneway.core.slot_load.prefill_load`:
the prompts they still prefill count as more running requests; among equals the one
whose prefix cache is the least full, so that prompts new to all spread over the
caches), unless a worker likely holds at least half of the request's prompt
(:class:`~laneway.core.prefix_cache.PrefixIndex`) and the request costs no more there
(:meth:`PrefixSpread.ahead`): then that one. Work of a class that ``patient`` marks
(throughput-bound: by default the batch classes) goes where its prompt is whenever that
worker has a free slot. The same weighing tells whether urgent work should stop batch
work on the full worker holding its prompt (:mod:`laneway.core.affinity`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from laneway.core.prefix_cache import PrefixIndex
from laneway.core.request import Request
from laneway.core.slot_load import PREFILL_TOKENS_A_SLOT, prefill_load
from laneway.core.workers import WorkerState

if TYPE_CHECKING:
    from laneway.core.isolation import Isolation
    from laneway.core.placement import Filter


class PrefixSpread:
    """The prefix index of a slot placement's workers, and the weighing of affinity
    against load that places by it."""

    __slots__ = ("filters", "index", "isolation", "patient")

    def __init__(
        self,
        index: PrefixIndex,
        filters: Sequence[Filter],
        patient: Sequence[bool],
        isolation: Isolation | None,
    ) -> None:
        self.index = index  # what each worker's prefix cache likely holds
        self.filters = tuple(filters)
        self.patient = tuple(patient)  # per class rank: whether it weighs affinity more
        self.isolation = isolation

    def choose(self, req: Request, free: Iterable[WorkerState], now: float) -> tuple[WorkerState | None, int]:
        """Among ``free`` (the workers with a free slot, the one idle longest first): the
        least loaded that passes the filters, or the one holding most of the prompt if
        that is at least half of it and the request costs no more there
        (:meth:`prefers`); with how many of the prompt's blocks the one chosen holds."""
        index = self.index
        least: WorkerState | None = None
        least_key: tuple[float, ...] = (math.inf,)
        least_blocks = 0
        iso = self.isolation
        best: WorkerState | None = None
        best_blocks = 0
        blocks = req.prefix
        for w in free:
            if self._fits(req, w, now):
                key = self._load_key(req, w, now)
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
        if self.prefers(req, self.ahead(req, busy, best_blocks), self.ahead(req, least_busy, least_blocks)):
            return best, best_blocks
        return least, least_blocks

    def holder(
        self, req: Request, workers: Iterable[WorkerState], down: set[str]
    ) -> tuple[WorkerState | None, int]:
        """The worker in service (not in ``down``) for ``req`` likely to hold most of its
        prompt, if at least half of it, and how many of the prompt's blocks it holds."""
        index = self.index
        blocks = req.prefix
        if not blocks:
            return None, 0
        best: WorkerState | None = None
        best_blocks = 0
        for w in workers:
            spec = w.spec
            if w.id in down or not spec.serves(req.model) or not spec.admits(req.cls):
                continue
            m = index.matched(w.id, blocks)
            if m > best_blocks:
                best, best_blocks = w, m
        return (best, best_blocks) if 2 * best_blocks >= len(blocks) else (None, 0)

    def stop_for(
        self,
        req: Request,
        workers: Sequence[WorkerState],
        free: Iterable[WorkerState],
        down: set[str],
        now: float,
    ) -> WorkerState | None:
        """The full worker holding ``req``'s prompt if :meth:`choose` would take it with a
        slot freed there rather than the worker it takes from ``free`` now (the least
        loaded, as :meth:`choose` ranks them); ``None``: no such worker, or not worth a
        stop."""
        holder, blocks = self.holder(req, workers, down)
        # (a worker whose cap withholds the slots its requests leave would not free one)
        if holder is None or holder.free > 0 or holder.usable <= 0 or holder.cap_debt > 0:
            return None
        fit = [w for w in free if self._fits(req, w, now)]
        least = min(fit, key=lambda w: self._load_key(req, w, now), default=None)  # (as choose ranks)
        if least is None:
            return None
        ahead = self.ahead(req, holder.usable - 1, blocks)
        least_ahead = self.ahead(req, least.usable - least.free, self.index.matched(least.id, req.prefix))
        return holder if self.prefers(req, ahead, least_ahead) else None

    def _fits(self, req: Request, w: WorkerState, now: float) -> bool:
        return all(f.fits(req, w, now) for f in self.filters)

    def _load_key(self, req: Request, w: WorkerState, now: float) -> tuple[float, ...]:
        """How loaded ``w`` is to ``req``, the lowest first: the share of its slots it runs,
        a prompt it still prefills weighing as more running requests; among equals the one
        whose cache is the least full (so that prompts new to all spread over the caches).
        On isolated workers what urgent work would stop there counts as free."""
        index = self.index
        key: tuple[float, ...] = (prefill_load(w), index.held(w.id) / index.capacity(w.id))
        iso = self.isolation
        return key if iso is None else (iso.score(req, w, now), iso.kind(req, w, now), *key)

    def ahead(self, req: Request, busy: int, matched: int) -> float:
        """What ``req`` would cost on a worker, in running requests: the ``busy`` ones there,
        and the part of its prompt not likely cached there (``matched`` blocks are) as one
        more for every :data:`~laneway.core.slot_load.PREFILL_TOKENS_A_SLOT` tokens.
        (Prompts others still prefill there are not counted: they pass in seconds, where a
        miss copies the prompt into a second cache, evicting others' — in the simulator
        counting them cost about a point of hit rate and 3-6 % of the agents' mean time to
        first token.)"""
        block = self.index.block_tokens
        own = max(max(req.prompt_tokens, len(req.prefix) * block) - matched * block, 0)
        return busy + own / PREFILL_TOKENS_A_SLOT

    def prefers(self, req: Request, ahead: float, least_ahead: float) -> bool:
        """Whether ``req`` goes to the worker holding most of its prompt, where it would
        cost ``ahead`` running requests (:meth:`ahead`), rather than to the least loaded
        candidate, where ``least_ahead``: a throughput-bound request always, else if it
        costs no more there (the prefill its cache saves weighs as the requests it would
        run beside)."""
        patient = req.preemptible and req.cls < len(self.patient) and self.patient[req.cls]
        return patient or ahead <= least_ahead
