"""A replica's census, as the leader takes it in: the table made to agree with what the
replica reports its requests do.

A new leader asks every replica what it runs (``CensusAsked``); each answers with its
requests' table entries (``Census``), in order with its events. :func:`take_census`
applies one answer to the leader's core and table.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from laneway.cluster.codec import Census, TableEntry, encode
from laneway.cluster.lending import Lender
from laneway.cluster.table import LiveTable
from laneway.core import Dispatch, InvalidTransition, LanewayError, Reject, Scheduler, UnknownRequest


@dataclass(frozen=True, slots=True)
class CensusTaken:
    """What a census changed: requests ended unreported, taken in running, queued."""

    dropped: int
    adopted: int
    requeued: int


def take_census(
    core: Scheduler,
    table: LiveTable,
    lender: Lender,
    census: Census,
    now: float,
    sets: dict[str, TableEntry],
    dels: set[str],
    out: list[tuple[str, list[Any]]],
) -> CensusTaken:
    """Make ``table`` (and ``core``) agree with what ``census.home`` reports. A request the
    table has that it no longer reports ended (its end was lost); one it runs where the
    table does not say is taken in as running there; one the table has running that it
    reports queued is sent its dispatch again (it was lost, or is on its way: a second is
    ignored); one the table lacks is queued. Its loans end: what ran on lent slots is
    reported as running. Refusals and dispatches for the replica go into ``out``."""
    home = census.home
    reported = {e.sent.id: e for e in census.entries}
    dropped = [rid for rid, h in table.home.items() if h == home and rid not in reported]
    for rid in dropped:
        with contextlib.suppress(UnknownRequest, InvalidTransition, LanewayError):
            core.cancel(rid, now)
        table.forget(rid, sets, dels)
    lender.drop([home])
    lender.hold_in(core)
    adopted = requeued = 0
    for rid, entry in reported.items():
        known = table.entries.get(rid)
        if known is not None:
            if known.state == entry.state and known.worker == entry.worker:
                continue
            if not entry.running and known.running:
                out.append((home, encode(Dispatch(rid, known.worker, None))))  # type: ignore[arg-type]
                continue
            with contextlib.suppress(UnknownRequest, InvalidTransition, LanewayError):
                core.cancel(rid, now)
            table.forget(rid, sets, dels)
        refused = take_in(core, table, rid, entry, now, sets, dels)
        if refused is not None:
            out.append((home, encode(refused)))
        elif table.entries[rid].running:
            adopted += 1
        else:
            requeued += 1
    return CensusTaken(len(dropped), adopted, requeued)


def take_in(
    core: Scheduler,
    table: LiveTable,
    rid: str,
    entry: TableEntry,
    now: float,
    sets: dict[str, TableEntry] | None = None,
    dels: set[str] | None = None,
) -> Reject | None:
    """Request ``rid`` as ``entry`` says into ``core`` and ``table``: running on its worker
    where it runs and the core can hold it there, else queued; the core's refusal, if it
    refuses it (then it is in neither)."""
    if entry.running and entry.worker in core.workers:
        try:
            core.adopt(entry.sent.request(), entry.worker, now)
            table.put(rid, entry, sets, dels)
            return None
        except LanewayError:
            pass  # (no slot to hold it: it waits instead)
    refused = core.submit(entry.sent.request(), now)
    if refused is None:
        table.put(rid, entry.queued(), sets, dels)
    return refused
