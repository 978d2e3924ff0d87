"""The leader's table of live requests (``PREFIX reqs``): each as its replica sent it,
queued or running where, and the replica that holds it.

The leader changes it as it applies events and decisions; each change also goes into
the ``sets`` and ``dels`` of the commit under way, which writes them to Redis with the
decisions (:mod:`laneway.cluster.commit`), so that the table in Redis always agrees with
how far the leader has read.
"""

from __future__ import annotations

from laneway.cluster.codec import TableEntry


class LiveTable:
    __slots__ = ("entries", "home")

    def __init__(self) -> None:
        self.home: dict[str, str] = {}  # rid -> the replica that holds it
        self.entries: dict[str, TableEntry] = {}  # rid -> its table entry

    def clear(self) -> None:
        self.home, self.entries = {}, {}

    def put(
        self,
        rid: str,
        entry: TableEntry,
        sets: dict[str, TableEntry] | None = None,
        dels: set[str] | None = None,
    ) -> None:
        """``rid`` is in the table as ``entry``, held by the replica that sent it (written with
        the commit under way, where ``sets`` and ``dels`` are given: a rebuild reads what is
        written already)."""
        self.home[rid] = entry.sent.home
        self.entries[rid] = entry
        if sets is not None:
            sets[rid] = entry
        if dels is not None:
            dels.discard(rid)

    def forget(self, rid: str, sets: dict[str, TableEntry], dels: set[str]) -> None:
        """A request ended (or refused): out of the table."""
        self.home.pop(rid, None)
        if self.entries.pop(rid, None) is not None:
            dels.add(rid)
        sets.pop(rid, None)

    def queued(self, rid: str, sets: dict[str, TableEntry]) -> None:
        """A request back in the queue (preempted, requeued)."""
        entry = self.entries.get(rid)
        if entry is not None:
            self.entries[rid] = sets[rid] = entry.queued()

    def running(self, rid: str, worker: str, sets: dict[str, TableEntry]) -> None:
        """A request dispatched to ``worker``."""
        entry = self.entries.get(rid)
        if entry is not None:
            self.entries[rid] = sets[rid] = entry.on(worker)

    def queued_of(self, model: str) -> list[str]:
        """The requests of ``model`` queued now, in arrival order."""
        entries = self.entries.items()
        return [
            rid
            for rid, e in sorted(entries, key=lambda kv: kv[1].sent.arrival_s)
            if not e.running and e.sent.model == model
        ]
