"""Which queued request gets the next free slot: pure functions over the lanes.

- :func:`select_strict`: strict class order with aging — the lowest
  ``(aged rank, arrival, seq)`` among the lane heads;
- :func:`select_share`: weighted class shares — the class furthest below its
  share of running slots, then the best of that class;
- :func:`best_in_class`: inside one class, the lowest ``(level, arrival, seq)``
  over its feedback levels, a level rising back one step per ``boost_s`` waited.

Heads are enough: inside a lane the head has the earliest arrival, so it has
waited longest and carries the largest aging boost. A blocked lane (its head
cannot be placed now) is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence

from laneway.core.aging import aged_rank
from laneway.core.lanes import Lanes
from laneway.core.request import Request

NONE_BLOCKED: set[int] = set()  # shared and never written: no lane is blocked


def select_strict(
    lanes: Lanes,
    now: float,
    blocked: set[int],
    interval_s: float | None,
    ceilings: Sequence[int],
    floors: Sequence[int],
) -> Request | None:
    """``ceilings[c]``: the most urgent rank class ``c`` may age to; ``floors[c]``:
    the most urgent rank it may have at all (``min(c, ceilings[c])`` with aging,
    else ``c``; 0 under fifo). Under fifo (a single lane per model) the earliest
    arrival wins."""
    single = lanes.single
    heaps = lanes.heaps
    lane_class = lanes.lane_class
    best: Request | None = None
    best_rank = 0  # the best's (rank, arrival_s, seq) key, when there is a best
    for lane, n in enumerate(lanes.count):
        if not n or lane in blocked:
            continue
        if best is not None and floors[lane_class[lane]] > best_rank:
            continue  # even aged as far as it may go, it ranks after the best so far
        req = heaps[lane][0][3]  # a lane's head is always valid (see Lanes)
        if single:
            rank = 0
        else:
            rank = cls = req.cls
            if interval_s is not None and rank > ceilings[cls]:
                rank = aged_rank(rank, now - req.arrival_s, interval_s, ceilings[cls])
        # the lowest (rank, arrival_s, seq) wins; ranks differ more often than not
        if (
            best is None
            or rank < best_rank
            or (rank == best_rank and (req.arrival_s, req.seq) < (best.arrival_s, best.seq))
        ):
            best, best_rank = req, rank
    return best


def best_in_class(
    lanes: Lanes, cls: int, now: float, blocked: set[int], boost_s: float | None
) -> Request | None:
    if lanes.single:
        return select_strict(lanes, now, blocked, None, (), (0,))
    count = lanes.count
    heaps = lanes.heaps
    best: Request | None = None
    best_key: tuple[int, float, int] | None = None
    for lane in lanes.lanes_of_class(cls):
        if not count[lane] or lane in blocked:
            continue
        req = heaps[lane][0][3]
        level = req.level
        if boost_s is not None and level:
            level = max(0, level - int((now - req.enqueued_s) // boost_s))
        key = (level, req.arrival_s, req.seq)
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
