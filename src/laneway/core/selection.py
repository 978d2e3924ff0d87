"""Which queued request gets the next free slot: pure functions over the lanes.

- :func:`select_strict`: strict class order with aging — the lowest
  ``(aged rank, arrival, seq)`` among the lane heads, where a request that rose
  ``k`` classes counts as arriving ``k`` aging intervals later than it did: it
  waits at most that much longer than the work of the class it rose to, rather
  than going ahead of all of it (a flood of aged P3 work kept P2 waiting as long
  as P3);
- :func:`select_share`: weighted class shares — the class furthest below its
  share of running slots, then the best of that class;
- :func:`best_in_class`: inside one class, the lowest ``(level, arrival, seq)``
  over its feedback levels, a level rising back one step per ``boost_s`` waited;
- :class:`Selector`: the policy's choice of these, and slots reserved for the class
  they were freed for (:mod:`laneway.core.promises`).

Heads are enough: inside a lane the head has the earliest arrival, so it has
waited longest and carries the largest aging boost. A blocked lane (its head
cannot be placed now) is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence

from laneway.core.aging import aged_rank
from laneway.core.lanes import Lanes
from laneway.core.promises import Promises
from laneway.core.request import Request
from laneway.core.tables import Tables

NONE_BLOCKED: set[int] = set()  # shared and never written: no lane is blocked
_UNRANKED = 1 << 20  # ranks after every real rank (and stays a small int)


def select_strict(lanes: Lanes, now: float, blocked: set[int], interval_s: float | None) -> Request | None:
    """The lowest ``(aged rank, arrival, seq)`` among the lane heads, looking at
    lanes in :attr:`Lanes.scan` order (under fifo every rank is 0: the
    earliest arrival wins). ``interval_s``: the aging interval."""
    heads = lanes.heads
    best: Request | None = None
    best_rank = _UNRANKED  # the best's (rank, arrival_s, seq) key, when there is a best
    best_at = 0.0
    for lane, rank, floor, ceiling in lanes.scan:
        if floor > best_rank:
            break  # this lane and all after it rank after the best, even aged
        head = heads[lane]
        if head is None or lane in blocked:
            continue
        req = head[3]
        at = req.tag  # (its arrival, or its place in its class's fair order)
        if ceiling is not None:  # it may have aged
            aged = aged_rank(rank, now - req.arrival_s, interval_s, ceiling)
            if aged < rank:  # it ranks as if it had arrived in the class it rose to that much later
                at += (rank - aged) * interval_s  # type: ignore[operator]
                rank = aged
        # the lowest (rank, arrival_s, seq) wins; ranks differ more often than not
        if rank < best_rank or (
            rank == best_rank and (at, req.seq) < (best_at, best.seq)  # type: ignore[union-attr]
        ):
            best, best_rank, best_at = req, rank, at
    return best


def best_in_class(
    lanes: Lanes, cls: int, now: float, blocked: set[int], boost_s: float | None
) -> Request | None:
    if lanes.single:
        return select_strict(lanes, now, blocked, None)
    heads = lanes.heads
    best: Request | None = None
    best_key: tuple[int, float, int] | None = None
    for lane in lanes.lanes_of_class(cls):
        head = heads[lane]
        if head is None or lane in blocked:
            continue
        req = head[3]
        level = req.level
        if boost_s is not None and level:
            level = max(0, level - int((now - req.enqueued_s) // boost_s))
        key = (level, req.tag, req.seq)
        if best_key is None or key < best_key:
            best, best_key = req, key
    return best


def select_share(
    lanes: Lanes,
    running: Sequence[int],
    weights: Sequence[float],
    rights: Sequence[frozenset[int]],
    now: float,
    blocked: set[int],
    boost_s: float | None,
) -> Request | None:
    """Work-conserving: a class with nothing queued leaves its share to others.

    A class with queued work that may preempt the class the shares pick goes
    first: the slot would only be taken back at once.
    """
    best: Request | None = None
    best_key: tuple[float, int] | None = None
    for c, weight in enumerate(weights):
        if not lanes.class_count[c]:
            continue
        key = (running[c] / weight, c)
        if best_key is not None and key >= best_key:
            continue
        req = best_in_class(lanes, c, now, blocked, boost_s)
        if req is not None:
            best, best_key = req, key
    if best is None:
        return None
    for c in range(best.cls):
        if best.cls in rights[c] and lanes.class_count[c]:
            req = best_in_class(lanes, c, now, blocked, boost_s)
            if req is not None:
                return req
    return best


class Selector:
    """Which queued request a free slot goes to, under the policy's order."""

    __slots__ = ("_running", "boost_s", "interval_s", "lanes", "promises", "rights_of", "shares", "weights")

    def __init__(
        self, tables: Tables, lanes: Lanes, running: Sequence[dict[str, Request]], promises: Promises
    ) -> None:
        self.lanes = lanes
        self.promises = promises
        self._running = running  # (the occupancy's, by class: read for the shares)
        self.shares = tables.shares
        self.weights = tables.weights
        self.rights_of = tables.rights_of
        self.interval_s = tables.interval_s
        self.boost_s = tables.boost_s

    def select(self, now: float, blocked: set[int]) -> Request | None:
        if self.shares:
            running = [len(r) for r in self._running]
            return select_share(self.lanes, running, self.weights, self.rights_of, now, blocked, self.boost_s)
        return select_strict(self.lanes, now, blocked, self.interval_s)

    def best_in_class(self, cls: int, now: float, blocked: set[int]) -> Request | None:
        return best_in_class(self.lanes, cls, now, blocked, self.boost_s)

    def reserved_head(self, now: float, blocked: set[int]) -> Request | None:
        """The request a freed, reserved slot goes to: the class it was freed for,
        unless a request of a more urgent class arrived meanwhile (the class
        that lost the slot claims another one in the same step)."""
        best = self.select(now, blocked)
        promises = self.promises
        for c, n in enumerate(promises.reserved):
            if n:
                req = best if best is not None and best.cls < c else self.best_in_class(c, now, blocked)
                if req is None:
                    promises.unreserve(c)  # nobody of that class is waiting any more
                    continue
                promises.use_reserved(c)
                return req
        return None
