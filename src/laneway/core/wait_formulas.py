"""The formulas of wait estimates, pure functions of numbers: when a running request may
end (:func:`end_span`), when a queued one starts behind others (:func:`wait_estimate`,
:func:`start_after`), the median of the first of several ends (:func:`first_end_median`).
:class:`~laneway.core.estimator.Estimator` gathers their inputs from the scheduler's state.
"""

from __future__ import annotations

import heapq
import math

from laneway.core.measures import SizeSpread
from laneway.core.request import Request


def end_span(r: Request, now: float, spread: SizeSpread) -> tuple[float, float]:
    """When a running request may end, from now. One that announced its size ends within
    its class's measured spread of the service it is expected to need, or when expected
    where none is measured yet (overdue: as much again as it overran, as below). Of one
    that did not, only its class's mean service is known: it may end any time before
    twice that mean (a service time uniform from 0 to twice it) or, once it ran past the
    mean, before twice its overrun."""
    ran = now - r.started_s + r.run_s
    if r.est_service_s is not None:
        within = spread.ranges[r.priority]
        if within is not None:
            latest = within[1] * r.est_s - ran
            if latest > 0.0:
                return max(within[0] * r.est_s - ran, 0.0), latest
        left = abs(r.expected_end_s - now)
        return left, left
    return 0.0, max(2.0 * r.est_s - ran, 2.0 * (ran - r.est_s), 1e-3)


def wait_estimate(
    *,
    slots: int,
    available: int,
    ahead: int,
    ahead_work_s: float,
    blocking: int,
    blocking_remaining_s: float,
    mean_service_s: float,
    urgent_load: float,
) -> float:
    """Expected seconds until a new request starts.

    - ``slots``: slots that could serve it; ``available``: of those, how many
      are free or held by work it may preempt;
    - ``ahead`` / ``ahead_work_s``: queued requests that dispatch before it and
      their expected service;
    - ``blocking`` / ``blocking_remaining_s``: running requests it cannot
      preempt and their total expected remaining service;
    - ``urgent_load``: more urgent work arriving per second, per slot (0–1).

    It needs the ``k = ahead + 1 - available`` th slot to free. Remaining
    times of blocking work are taken as uniform on ``[0, 2 x mean]``, so the
    k-th of them ends near ``2 x mean x k / (blocking + 1)``; past the first
    round, slots free at ``slots / mean service``. Urgent arrivals take their
    share of capacity meanwhile: the result is stretched by ``1 / (1 - load)``.
    """
    if slots <= 0:
        return math.inf
    k = ahead + 1 - available
    if k <= 0:
        return 0.0
    mean_rem = blocking_remaining_s / blocking if blocking else 0.0
    if k <= blocking:
        t = 2.0 * mean_rem * k / (blocking + 1)
    else:
        per_item = ahead_work_s / ahead if ahead else mean_service_s
        first = 2.0 * mean_rem * blocking / (blocking + 1) if blocking else 0.0
        t = first + (k - blocking) * per_item / slots
    load = min(max(urgent_load, 0.0), 0.9)
    return t / (1.0 - load)


FIRST_END_STEPS = 16  # bisection steps for the median of the first end (to 1/65536 of it)


def first_end_median(spans: list[tuple[float, float]]) -> float:
    """The median time until the first of some running requests ends, each ending at a
    uniformly distributed time in its ``(earliest, latest)`` span from now (a point
    where both are equal).

    The first end is a minimum: of many requests whose sizes are not known, the one
    that ran longest (the earliest expected end) is not the one that ends first; of 16
    running chats of 1–12 s, one ends well within a second on average. It is taken
    where the chance that none has ended yet falls to one half."""
    cap = math.inf  # the first point: by then one has ended for sure
    real = []  # (earliest, latest, the span's width)
    for a, b in spans:
        if b > a:
            real.append((a, b, b - a))
        elif a < cap:
            cap = a
    if not real:
        return cap
    lo, hi = 0.0, min(cap, max(r[1] for r in real))
    for _ in range(FIRST_END_STEPS):
        x = (lo + hi) / 2
        alive = 1.0  # chance that none has ended by x
        for a, b, width in real:
            if x >= b:
                alive = 0.0
                break
            if x > a:
                alive *= (b - x) / width
                if alive <= 0.5:
                    break  # (it only falls: x is past the median already)
        if alive > 0.5:
            lo = x
        else:
            hi = x
    return (lo + hi) / 2


def start_after(free: int, ends: list[float], ahead: int, service_s: float) -> float:
    """When a request starts behind ``ahead`` queued ones of ``service_s`` each: each of
    those takes the first slot to come free (``free`` slots now, the others at ``ends``
    from now) and frees it again after its service; it takes the next. A short request
    ahead uses a slot and gives it back before the long ones running end."""
    slots = [0.0] * free + list(ends)
    if not slots:
        return math.inf
    heapq.heapify(slots)
    for _ in range(ahead):
        heapq.heapreplace(slots, slots[0] + service_s)
    return slots[0]
