"""Which queued request a free slot goes to: the scheduler's glue over
:mod:`laneway.core.selection` (strict classes or weighted shares, and slots
held for the class they were freed for).

A mixin of :class:`~laneway.core.scheduler.Scheduler`.
"""

from __future__ import annotations

from laneway.core.request import Request
from laneway.core.selection import best_in_class, select_share, select_strict


class Selecting:
    __slots__ = ()  # the scheduler's attributes are slots (see Scheduler)

    def _reserved_head(self, now: float, blocked: set[int]) -> Request | None:
        """The request a freed, reserved slot goes to: the class it was freed for,
        unless a request of a more urgent class arrived meanwhile (the class
        that lost the slot claims another one in the same step)."""
        best = self._select(now, blocked)
        for c, n in enumerate(self._reserved):
            if n:
                req = best if best is not None and best.cls < c else self._best_in_class(c, now, blocked)
                if req is None:
                    self._reserved_total -= n
                    self._reserved[c] = 0  # nobody of that class is waiting any more
                    continue
                self._reserved[c] -= 1
                self._reserved_total -= 1
                return req
        return None

    def _select(self, now: float, blocked: set[int]) -> Request | None:
        if self._shares:
            running = [len(r) for r in self._running]
            return select_share(
                self.lanes, running, self._weights, self._rights_of, now, blocked, self._boost
            )
        return select_strict(self.lanes, now, blocked, self._interval)

    def _best_in_class(self, cls: int, now: float, blocked: set[int]) -> Request | None:
        return best_in_class(self.lanes, cls, now, blocked, self._boost)
