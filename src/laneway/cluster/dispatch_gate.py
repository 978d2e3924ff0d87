"""Decisions a replica holds while it makes the worker of a dispatch among them.

In a cluster's fleet the leader may dispatch a request to an engine another replica
started (``PREFIX engines`` lists it); this replica has no worker for it yet. The
dispatch, and every decision after it, is held — in order, so that a preemption or a
rejection never overtakes the dispatch it follows — until the worker is made
(:class:`~laneway.cluster.fleet_replica.EngineDirectory`), then handed on. A worker
that cannot be made still gets its dispatch handed on: the request fails over from it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from laneway.cluster import tasks
from laneway.core import Decision, Dispatch

log = logging.getLogger("laneway.cluster")


class DispatchGate:
    def __init__(
        self,
        knows: Callable[[str], bool],
        make: Callable[[str], Awaitable[None]],
        hand_on: Callable[[Decision], None],
        replica: str,
    ) -> None:
        self.knows = knows  # whether a worker is made here
        self.make = make  # make the worker of an engine another replica started
        self.hand_on = hand_on  # a decision goes on to the runtime
        self.replica = replica
        self._held: list[Decision] = []
        self._task: asyncio.Task[None] | None = None

    def holds(self, d: Decision) -> bool:
        """Whether ``d`` is held (some decision before it is, or it is a dispatch to a
        worker not made here yet): it is handed on once its turn comes."""
        if not self._held and not (type(d) is Dispatch and not self.knows(d.worker_id)):
            return False
        self._held.append(d)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._resolve())
        return True

    async def _resolve(self) -> None:
        """Hand the held decisions on in order, each dispatch once its worker is made."""
        try:
            while self._held:
                held = self._held
                d = held[0]
                if type(d) is Dispatch and not self.knows(d.worker_id):
                    try:
                        await self.make(d.worker_id)
                    except Exception:  # (the dispatch goes on: its request fails over from there)
                        log.exception(
                            "replica %s: the worker %s could not be made", self.replica, d.worker_id
                        )
                    if self._held is not held:  # cleared meanwhile: what is held now is looked at anew
                        continue
                self.hand_on(held.pop(0))
        finally:
            self._task = None

    def clear(self) -> None:
        """Drop what is held (the replica goes on under a new name: its requests ended)."""
        self._held = []

    async def close(self) -> None:
        await tasks.stop(self._task)
