"""The queued requests: one FIFO queue per lane, with lazy deletion.

A lane is ``(model, class, level)``: the model asked for, the effective
class (after priority inheritance) and the multi-level-feedback level (always
0 unless the policy uses feedback). Under ``fifo`` a lane is just the model:
one queue per model, as an engine has. Separate lanes per model keep a request
whose model cannot be placed now from blocking requests for other models.
Inside a lane the order is the total order ``(tag, seq)``: the tag is the
request's arrival time, or, where tenants share a class by tokens, its place in
the class's fair order (:mod:`laneway.core.fairness`); a preempted request
keeps its tag and so goes back to the head of its class.

Requests mostly enter a lane in that order, so a lane is a deque, appended
to and popped from the left in O(1), beside a heap that takes the few entries
that arrive out of order (a preempted request going back in, a request
submitted with an earlier arrival time). Either holds entries
``(tag, seq, gen, request)``; the lane's head is the lesser of their
fronts and is kept in :attr:`Lanes.heads` (``None``: the lane is empty).

Going back to the queue and leaving it as a request's lifecycle goes (:meth:`Lanes.back`,
:meth:`Lanes.leave`, :meth:`Lanes.pop_head` with the time) also keeps what the queue
settles: the earliest deadline (:mod:`laneway.core.expiry`, given with ``expiry``), the
request's time queued, and its tenant's count of queued requests (``admission``);
:meth:`push` and :meth:`take` alone move a request between lanes (a class raised by
inheritance). A new request enters with :meth:`push`, its deadline and its tenant's
counts set by the scheduler's ``submit``.

Removal is lazy: an entry carries the request's generation, and an entry
whose generation no longer matches is stale (a request leaves the queue only
through :meth:`Lanes.take`, which bumps it, or :meth:`Lanes.pop_head`, which
removes its entry, a front). Stale entries are dropped as soon as they reach the front of the deque or the top
of the heap, so both fronts, and the head, are always valid.

:attr:`Lanes.scan` lists the lanes in the order strict selection looks at
them: by the most urgent rank a request in the lane may reach (its class, or
the ceiling it ages towards), so a scan stops at the first lane that cannot
beat the best head found so far.
"""

from __future__ import annotations

from collections import deque
from heapq import heappop, heappush
from typing import TYPE_CHECKING

from laneway.core.request import Request

if TYPE_CHECKING:
    from laneway.core.admission import Admission
    from laneway.core.expiry import Expiry

Entry = tuple[float, int, int, Request]


# one lane in the order strict selection looks at them: (lane, rank of its class,
# the most urgent rank it may age to, the ceiling it ages towards or None)
ScanEntry = tuple[int, int, int, int | None]


class Lanes:
    """``ceilings[c]``: the most urgent rank class ``c`` may age to, when
    requests age (``None``: they never do). ``lane_counts``: keep :attr:`count`
    per lane (for :meth:`model_queued`; GPU placement needs it)."""

    def __init__(
        self,
        n_classes: int,
        levels: int,
        single: bool,
        ceilings: list[int] | None = None,
        *,
        lane_counts: bool = True,
        expiry: Expiry | None = None,
        admission: Admission | None = None,
    ) -> None:
        if single and levels > 1:
            raise ValueError("feedback levels need class lanes")
        self.n_classes = n_classes
        self.expiry = expiry  # (the deadlines of those waiting: pop_head and leave keep it)
        self.admission = admission  # (tenants' counts of queued requests)
        self.levels = levels
        self.single = single
        self.width = 1 if single else n_classes * levels  # lanes per model
        self._stride = 0 if single else levels  # lane offset per class inside a model
        self.models: dict[str | None, int] = {}
        self._base: dict[str | None, int] = {}  # model -> its first lane
        self.fifos: list[deque[Entry]] = []  # entries in order, per lane
        self.sides: list[list[Entry]] = []  # heaps of the entries that came out of order
        self.heads: list[Entry | None] = []  # each lane's first entry
        self.lane_counts = lane_counts
        self.count: list[int] = []  # valid entries per lane, if lane_counts
        self.lane_class: list[int] = []  # the class of each lane (0 under fifo)
        self.class_count = [0] * n_classes  # queued per effective class
        # queued per (class, level); with one level, that is class_count itself
        self.level_count = [0] * (n_classes * levels) if levels > 1 else self.class_count
        self.hint_work = [0.0] * n_classes  # sum of service hints per class
        self.hint_count = [0] * n_classes
        self.total = 0
        self._ceilings = ceilings
        self.ceilings = ceilings  # (read by the wait estimates)
        self._class_lanes: list[list[int]] = []
        self.scan: list[ScanEntry] = []  # every lane, by the most urgent rank it may reach
        self._model_index(None)

    def _model_index(self, model: str | None) -> int:
        m = self.models.get(model)
        if m is None:
            m = self.models[model] = len(self.models)
            self._base[model] = m * self.width
            self.fifos.extend(deque() for _ in range(self.width))
            self.sides.extend([] for _ in range(self.width))
            self.heads.extend([None] * self.width)
            self.count.extend([0] * self.width)
            self.lane_class.extend(0 if self.single else i // self.levels for i in range(self.width))
            self._index_lanes()
        return m

    # ``take`` uses ``req.lane``, set by ``push``: a queued request's class and
    # level change only through take + push.

    def push(self, req: Request) -> None:
        c = req.cls
        base = self._base.get(req.model)
        if base is None:
            base = self._model_index(req.model) * self.width
        lane = req.lane = base + c * self._stride + req.level
        req.gen = gen = req.gen + 1
        entry = (req.tag, req.seq, gen, req)
        fifo = self.fifos[lane]
        if fifo and entry > fifo[-1]:
            fifo.append(entry)  # in order, the common case: after the head
        elif not fifo:
            fifo.append(entry)
            head = self.heads[lane]
            if head is None or entry < head:
                self.heads[lane] = entry
        else:
            heappush(self.sides[lane], entry)
            if entry < self.heads[lane]:  # type: ignore[operator]
                self.heads[lane] = entry
        if self.lane_counts:
            self.count[lane] += 1
        self.class_count[c] += 1
        if self.levels > 1:
            self.level_count[c * self.levels + req.level] += 1
        self.total += 1
        hint = req.est_service_s
        if hint is not None:
            self.hint_work[c] += hint
            self.hint_count[c] += 1

    def head(self, lane: int) -> Request | None:
        entry = self.heads[lane]
        return entry[3] if entry is not None else None

    def take(self, req: Request) -> None:
        """Remove a queued request (dispatched, expired, shed or cancelled)."""
        self._uncount(req)
        req.gen += 1  # its entry is stale from now on
        lane = req.lane
        fifo = self.fifos[lane]
        side = self.sides[lane]
        if (fifo and fifo[0][3] is req) or (side and side[0][3] is req):
            self._settle(lane)  # a front went stale

    # ------------------------------------------------------------------ the lifecycle
    def back(self, req: Request, now: float) -> None:
        """A preempted request waits again (at the head of its class: it keeps its place in
        its order); it never times out in the queue again."""
        req.enqueued_s = now
        self.push(req)
        if req.tenant is not None:
            self.admission.on_requeue(req.tenant)  # type: ignore[union-attr]

    def leave(self, req: Request, now: float) -> None:
        """``req`` stops waiting: it is expired, shed, cancelled or withdrawn."""
        self.take(req)
        self._left(req, now)

    def _left(self, req: Request, now: float) -> None:
        expiry = self.expiry
        if expiry is not None and req.deadline_s <= expiry.next_due:
            expiry.stale = True  # the earliest deadline may be gone with it
        req.queued_total_s += now - req.enqueued_s
        if req.tenant is not None and self.admission is not None:
            self.admission.on_dequeue(req.tenant)

    def pop_head(self, req: Request, now: float | None = None) -> None:
        """Remove ``req``, the head of its lane (as selection returns it); with ``now``, it
        stops waiting then: it is dispatched (:meth:`_left`, inline: the hot path)."""
        if now is not None:  # (given by the scheduler, whose lanes have their expiry and admission)
            expiry = self.expiry
            if req.deadline_s <= expiry.next_due:  # type: ignore[union-attr]
                expiry.stale = True  # type: ignore[union-attr]  # the earliest deadline may be gone with it
            req.queued_total_s += now - req.enqueued_s
            if req.tenant is not None:
                self.admission.on_dequeue(req.tenant)  # type: ignore[union-attr]
        c = req.cls  # self._uncount(req), inline: the hot path
        lane = req.lane
        if self.lane_counts:
            self.count[lane] -= 1
        self.class_count[c] -= 1
        if self.levels > 1:
            self.level_count[c * self.levels + req.level] -= 1
        self.total -= 1
        hint = req.est_service_s
        if hint is not None:
            self.hint_count[c] -= 1
            self.hint_work[c] = self.hint_work[c] - hint if self.hint_count[c] else 0.0
        # its entry, a front, leaves the lane (no need to make it stale)
        fifo = self.fifos[lane]
        side = self.sides[lane]
        if not side:  # the common case: the head is the deque's; self._settle(lane), inline
            fifo.popleft()
            while fifo:
                entry = fifo[0]
                if entry[2] == entry[3].gen:
                    self.heads[lane] = entry
                    return
                fifo.popleft()
            self.heads[lane] = None
            return
        if fifo and fifo[0][3] is req:
            fifo.popleft()
        else:
            heappop(side)
        self._settle(lane)

    def _settle(self, lane: int) -> None:
        """Drop stale entries from both fronts and find the lane's head again."""
        fifo = self.fifos[lane]
        while fifo:
            entry = fifo[0]
            if entry[2] == entry[3].gen:
                break
            fifo.popleft()
        side = self.sides[lane]
        while side:
            entry = side[0]
            if entry[2] == entry[3].gen:
                break
            heappop(side)
        if side:
            self.heads[lane] = side[0] if not fifo or side[0] < fifo[0] else fifo[0]
        else:
            self.heads[lane] = fifo[0] if fifo else None

    def _uncount(self, req: Request) -> None:
        c = req.cls
        if self.lane_counts:
            self.count[req.lane] -= 1
        self.class_count[c] -= 1
        if self.levels > 1:
            self.level_count[c * self.levels + req.level] -= 1
        self.total -= 1
        hint = req.est_service_s
        if hint is not None:
            self.hint_count[c] -= 1
            # no float residue once the last hinted request of the class leaves
            self.hint_work[c] = self.hint_work[c] - hint if self.hint_count[c] else 0.0

    def model_queued(self, model: str | None) -> int:
        """Queued requests naming ``model`` (needs ``lane_counts``)."""
        if not self.lane_counts:
            raise ValueError("these lanes keep no counts per lane (lane_counts=False)")
        m = self.models.get(model)
        if m is None:
            return 0
        if self.single:
            return self.count[m]
        base = m * self.width
        return sum(self.count[base : base + self.width])

    def lanes_of_class(self, cls: int) -> list[int]:
        """Every lane holding class ``cls`` (every lane under fifo)."""
        return self._class_lanes[cls]

    def _index_lanes(self) -> None:
        lanes = range(len(self.heads))
        if self.single:
            self._class_lanes = [list(lanes)] * self.n_classes
            self.scan = [(lane, 0, 0, None) for lane in lanes]
            return
        models = range(len(self.models))
        self._class_lanes = [
            [m * self.width + c * self.levels + lv for m in models for lv in range(self.levels)]
            for c in range(self.n_classes)
        ]
        scan: list[ScanEntry] = []
        for lane in lanes:
            c = self.lane_class[lane]
            ceiling = self._ceilings[c] if self._ceilings is not None else c
            if c <= ceiling:  # it never ages past its own class
                scan.append((lane, c, c, None))
            else:
                scan.append((lane, c, ceiling, ceiling))
        self.scan = sorted(scan, key=lambda e: (e[2], e[0]))

    def waiting_below(self, cls: int, level: int) -> bool:
        """Whether class ``cls`` has queued work at a level better than ``level``."""
        base = cls * self.levels
        return any(self.level_count[base + lv] for lv in range(level))

    def queued_up_to(self, cls: int, level: int) -> int:
        base = cls * self.levels
        return sum(self.level_count[base : base + level + 1])
