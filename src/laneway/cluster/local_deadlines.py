"""When a replica gives up on a request it sent the leader and heard nothing back of: its
queue timeout and a grace (:data:`LOCAL_GRACE_S`) after it was sent — the leader refuses it
at its timeout, unless the leader cannot be reached. A request back in the leader's hands
after a start (requeued, preempted, a dispatch held) waits on no timeout there, so it is
given up on only while the cluster stays out of reach: its deadline renews while the
replica is connected."""

from __future__ import annotations

import math

LOCAL_GRACE_S = 5.0  # past a request's queue timeout, with no decision: given up on here


class LocalDeadlines:
    def __init__(self) -> None:
        self._at: dict[str, float] = {}  # request id -> when it is given up on (the runtime's clock)
        self._back: dict[str, float] = {}  # of those, the ones started before -> the span they renew by

    def arm(self, request_id: str, limit: float | None, now: float, *, back: bool = False) -> None:
        """Give ``request_id`` up at ``now`` + its queue timeout ``limit`` + the grace (none
        where it has no finite timeout); ``back``: it started before."""
        if limit is not None and math.isfinite(limit):
            self._at[request_id] = now + limit + LOCAL_GRACE_S
            if back:
                self._back[request_id] = limit + LOCAL_GRACE_S

    def drop(self, request_id: str) -> None:
        """A decision came (or the request ended): nothing to give up on."""
        self._at.pop(request_id, None)
        self._back.pop(request_id, None)

    def due(self, now: float, connected: bool) -> list[str]:
        """The requests to give up on at ``now`` (forgotten here); those back in the leader's
        hands wait on while the replica is ``connected``."""
        late = [rid for rid, at in self._at.items() if at <= now]
        out = []
        for rid in late:
            del self._at[rid]
            span = self._back.pop(rid, None)
            if span is not None and connected:  # (it waits its turn with the leader)
                self._at[rid] = now + span
                self._back[rid] = span
            else:
                out.append(rid)
        return out

    def next(self) -> float:
        return min(self._at.values(), default=math.inf)

    def clear(self) -> None:
        self._at.clear()
        self._back.clear()
