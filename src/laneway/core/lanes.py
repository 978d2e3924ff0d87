"""The queued requests: one FIFO heap per lane, with lazy deletion.

A lane is ``(model, class, level)``: the model asked for, the effective
class (after priority inheritance) and the multi-level-feedback level (always
0 unless the policy uses feedback). Under ``fifo`` a lane is just the model:
one queue per model, as an engine has. Separate lanes per model keep a request
whose model cannot be placed now from blocking requests for other models.
Inside a lane the order is the total order ``(arrival_s, seq)``; a preempted
request keeps its arrival time and so goes back to the head of its class.

Removal is lazy: a heap entry carries the request's generation, and an entry
whose generation no longer matches is stale (a request leaves the queue only
through :meth:`Lanes.take`, which bumps it). ``take`` drops stale entries as
soon as they reach the top, so the head of a lane is always valid:
``count[lane] > 0`` means ``heaps[lane][0][3]`` is its first request.
"""

from __future__ import annotations

from heapq import heappop, heappush

from laneway.core.request import Request

Entry = tuple[float, int, int, Request]


class Lanes:
    def __init__(self, n_classes: int, levels: int, single: bool) -> None:
        self.n_classes = n_classes
        self.levels = levels
        self.single = single
        self.width = 1 if single else n_classes * levels  # lanes per model
        self.models: dict[str | None, int] = {}
        self.heaps: list[list[Entry]] = []
        self.count: list[int] = []  # valid entries per lane
        self.lane_class: list[int] = []  # the class of each lane (0 under fifo)
        self.class_count = [0] * n_classes  # queued per effective class
        # queued per (class, level); with one level, that is class_count itself
        self.level_count = [0] * (n_classes * levels) if levels > 1 else self.class_count
        self.hint_work = [0.0] * n_classes  # sum of service hints per class
        self.hint_count = [0] * n_classes
        self.total = 0
        self._class_lanes: list[list[int]] = []
        self._model_index(None)

    def _model_index(self, model: str | None) -> int:
        m = self.models.get(model)
        if m is None:
            m = self.models[model] = len(self.models)
            self.heaps.extend([] for _ in range(self.width))
            self.count.extend([0] * self.width)
            self.lane_class.extend(0 if self.single else i // self.levels for i in range(self.width))
            self._index_lanes()
        return m

    def lane_of(self, req: Request) -> int:
        m = self.models.get(req.model)
        if m is None:
            m = self._model_index(req.model)
        if self.single:
            return m
        return m * self.width + req.cls * self.levels + req.level

    # ``take`` uses ``req.lane``, set by ``push``: a queued request's class and
    # level change only through take + push.

    def push(self, req: Request) -> None:
        c = req.cls
        m = self.models.get(req.model)
        if m is None:
            m = self._model_index(req.model)
        lane = req.lane = m if self.single else m * self.width + c * self.levels + req.level
        req.gen = gen = req.gen + 1
        heappush(self.heaps[lane], (req.arrival_s, req.seq, gen, req))
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
        heap = self.heaps[lane]
        return heap[0][3] if heap else None

    def take(self, req: Request) -> None:
        """Remove a queued request (dispatched, expired, shed or cancelled)."""
        c = req.cls
        lane = req.lane
        self.count[lane] -= 1
        self.class_count[c] -= 1
        if self.levels > 1:
            self.level_count[c * self.levels + req.level] -= 1
        self.total -= 1
        if req.est_service_s is not None:
            self.hint_count[c] -= 1
            # no float residue once the last hinted request of the class leaves
            self.hint_work[c] = self.hint_work[c] - req.est_service_s if self.hint_count[c] else 0.0
        req.gen += 1  # its heap entry is now stale
        heap = self.heaps[lane]
        if heap[0][3] is req:
            heappop(heap)
            # drop stale entries that reached the top: the head stays valid
            while heap:
                head = heap[0]
                if head[2] == head[3].gen:
                    break
                heappop(heap)

    def model_queued(self, model: str | None) -> int:
        """Queued requests naming ``model``."""
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
        if self.single:
            every = list(range(len(self.heaps)))
            self._class_lanes = [every] * self.n_classes
            return
        models = range(len(self.models))
        self._class_lanes = [
            [m * self.width + c * self.levels + lv for m in models for lv in range(self.levels)]
            for c in range(self.n_classes)
        ]

    def waiting_below(self, cls: int, level: int) -> bool:
        """Whether class ``cls`` has queued work at a level better than ``level``."""
        base = cls * self.levels
        return any(self.level_count[base + lv] for lv in range(level))

    def queued_up_to(self, cls: int, level: int) -> int:
        base = cls * self.levels
        return sum(self.level_count[base : base + level + 1])
