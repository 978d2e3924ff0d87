"""How the leader carries out its core's decisions: each goes to the stream of the replica
that holds its request (a fleet's loads and evictions to the replica that owns the node),
and the table of live requests follows, written with the same commit."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from laneway.cluster.codec import TableEntry, encode
from laneway.core import Dispatch, Evict, LanewayError, Load, Preempt, Reject
from laneway.core.decisions import LoadAdapter, UnloadAdapter

if TYPE_CHECKING:
    from laneway.cluster.leader import Leader

log = logging.getLogger("laneway.cluster")


class Relay:
    """The leader's :class:`~laneway.core.decisions.Actuator`: a decision about a request
    goes to the stream of the replica that holds it, and the table of live requests
    follows (written with the same commit)."""

    __slots__ = ("dels", "leader", "out", "sets")

    def __init__(
        self, leader: Leader, sets: dict[str, TableEntry], dels: set[str], out: list[tuple[str, list[Any]]]
    ) -> None:
        self.leader = leader
        self.sets = sets
        self.dels = dels
        self.out = out

    def dispatch(self, d: Dispatch, now: float) -> None:
        home = self.leader.table.home.get(d.request_id)
        if home is not None:
            self.leader.table.running(d.request_id, d.worker_id, self.sets)
            self.out.append((home, encode(d)))
        elif self.leader.core is not None:  # (no replica holds it: its slot is free again)
            with contextlib.suppress(LanewayError):
                self.leader.core.finished(d.request_id, now, failed=True)

    def preempt(self, d: Preempt, now: float) -> None:
        home = self.leader.table.home.get(d.request_id)
        if home is not None:
            self.out.append((home, encode(d)))

    def reject(self, d: Reject, now: float) -> None:
        home = self.leader.table.home.get(d.request_id)
        if home is not None:
            self.leader.table.forget(d.request_id, self.sets, self.dels)
            self.out.append((home, encode(d)))

    def _owner(self, d: Load | Evict | LoadAdapter | UnloadAdapter) -> None:
        """A fleet's decision goes to the replica that owns its node."""
        fleet = self.leader.fleet
        if fleet is None:
            log.error("a decision to load or unload (%s) in a cluster without a fleet", type(d).__name__)
            return
        home = fleet.route(d)
        if home is None:  # (its node's owner is gone: its engines with it)
            log.warning("%s: no replica owns the node of %s", type(d).__name__, d.replica_id)
            return
        self.out.append((home, encode(d)))

    def load(self, d: Load, now: float) -> None:
        self._owner(d)

    def evict(self, d: Evict, now: float) -> None:
        self._owner(d)

    def load_adapter(self, d: LoadAdapter, now: float) -> None:
        self._owner(d)

    def unload_adapter(self, d: UnloadAdapter, now: float) -> None:
        self._owner(d)
