"""Replicas taken for dead, as the leader handles them: their requests cancelled in the
core, and the slots they may still use held (quarantined) until their engines show them
ended.

A replica that stops saying it lives is taken for dead (:mod:`laneway.cluster.liveness`).
Its HTTP streams to the upstreams died with it — or, were it only standing still, it runs
them on: so the slots its requests ran on, and those lent to it, stay held for it until
the worker's engine runs no more than the leader counts there
(:func:`release_quarantines`), or at a time limit where the engine gives no count.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from laneway.cluster.codec import TableEntry
from laneway.cluster.lending import Lender
from laneway.cluster.table import LiveTable
from laneway.core import InvalidTransition, LanewayError, Scheduler, UnknownRequest

log = logging.getLogger("laneway.cluster")

QUARANTINE_GRACE_S = 5.0  # a dead replica's request is taken to end by twice its size and this
QUARANTINE_MAX_S = 120.0  # the longest slots are held for a dead replica (an engine with no count)
LENT_HOLD_S = 10.0  # the same for its lent slots (short requests)


def cancel_dead(
    core: Scheduler,
    table: LiveTable,
    lender: Lender,
    dead: set[str],
    now: float,
    sets: dict[str, TableEntry],
    dels: set[str],
) -> tuple[int, int]:
    """Cancel the requests of the ``dead`` homes and end their loans, holding for each
    (home, worker) what it may still run there: its requests placed there and its lent
    slots, for as long as the longest of them may take. How many requests were cancelled,
    how many slots are held."""
    held: dict[tuple[str, str], int] = {}
    longest: dict[tuple[str, str], float] = {}
    for (h, w), loan in lender.loans.items():
        if h in dead and loan.until == 0 and loan.hold:
            held[(h, w)] = loan.hold
            longest[(h, w)] = LENT_HOLD_S
    lender.drop(dead)
    gone = [rid for rid, h in table.home.items() if h in dead]
    for rid in gone:
        entry = table.entries.get(rid)
        if entry is not None and entry.running and entry.worker in core.workers:
            key = (table.home[rid], entry.worker)
            held[key] = held.get(key, 0) + 1
            size = entry.sent.est_service_s
            est = size if isinstance(size, int | float) else QUARANTINE_MAX_S
            longest[key] = max(longest.get(key, 0.0), 2 * est + QUARANTINE_GRACE_S)
        with contextlib.suppress(UnknownRequest, InvalidTransition, LanewayError):
            core.cancel(rid, now)
        table.forget(rid, sets, dels)
    for (h, w), n in held.items():
        lender.quarantine(h, w, n, now + min(longest[(h, w)], QUARANTINE_MAX_S))
    return len(gone), sum(held.values())


async def release_quarantines(
    core: Scheduler,
    lender: Lender,
    engine_load: Callable[[str], Awaitable[int | None]] | None,
    now: float,
) -> None:
    """Give back the slots of dead homes once their engine shows their requests gone (it
    runs no more than the requests the leader counts there, live replicas' lent ones
    included), or at their time limit where the engine gives no count."""
    by_worker: dict[str, list[tuple[str, float]]] = {}
    for (h, w), loan in lender.quarantined().items():
        by_worker.setdefault(w, []).append((h, loan.until))
    for w, homes in by_worker.items():
        state = core.workers.get(w)
        counted = None
        if state is not None and engine_load is not None:
            with contextlib.suppress(Exception):
                counted = await engine_load(w)
        if counted is not None and state is not None:
            known = len(state.running) + lender.lent_out(w)
            if counted <= known:
                for h, _ in homes:
                    lender.release(h, w)
                log.info(
                    "worker %s: the engine runs %d requests: the dead replicas' slots are free", w, counted
                )
                continue
        for h, until in homes:
            if now >= until:
                lender.release(h, w)
                log.warning(
                    "worker %s: slots of the dead replica %s given back at their time limit (%s)",
                    w,
                    h,
                    "the engine gives no count" if counted is None else f"the engine still runs {counted}",
                )
