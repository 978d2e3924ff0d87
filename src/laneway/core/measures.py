"""What the scheduler measures as it goes, for its estimates and its cost of preemption:

- :class:`ServiceStats`: service times per class (and per model);
- :class:`SizeSpread`: how the service of sized requests compared with their size;
- :class:`ArrivalRates`: how much work per second arrives in each class, so an estimate
  accounts for more urgent work that will arrive while one waits;
- :class:`Calibration`: how estimates compared with the waits that followed, which
  corrects them and gives their interval (:class:`WaitRange`);
- the cost model, moved toward the checkpoints workers measure.

:class:`Measures` holds one of each; :mod:`laneway.core.estimator` reads them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from laneway.core.costs import CostModel
from laneway.core.request import State


class ServiceStats:
    """Mean measured service time per class and per (class, model), with a prior.

    A class not measured yet borrows the mean over every sample so far (the
    prior before any). ``means[c]`` is kept current on every record for the
    measured classes and NaN for the others, which read ``overall``.
    """

    def __init__(
        self,
        n_classes: int,
        prior_s: float,
        prior_weight: float = 1.0,
        class_priors: Sequence[float | None] = (),
    ) -> None:
        self.prior_s = prior_s
        self.prior_w = prior_weight
        self._prior_mass = prior_s * prior_weight
        self.sum = [0.0] * n_classes
        self.n = [0] * n_classes
        # a class with a prior of its own (configured) reads it until it is measured
        self.class_priors = [class_priors[c] if c < len(class_priors) else None for c in range(n_classes)]
        self.means = [math.nan if p is None else p for p in self.class_priors]
        # per class, the weight of its prior in its mean (its own, else the default's)
        self._mass = [self._prior_mass if p is None else p * prior_weight for p in self.class_priors]
        self.by_model: dict[tuple[int, str], list[float]] = {}
        self.overall = prior_s  # the mean over every sample of every class
        self._total = 0.0
        self._count = 0

    def record(self, cls: int, model: str | None, service_s: float) -> None:
        total = self.sum[cls] = self.sum[cls] + service_s
        n = self.n[cls] = self.n[cls] + 1
        if model is not None:
            acc = self.by_model.setdefault((cls, model), [0.0, 0.0])
            acc[0] += service_s
            acc[1] += 1
        self.means[cls] = (total + self._mass[cls]) / (n + self.prior_w)
        self._total += service_s
        self._count += 1
        self.overall = self._total / self._count

    def mean(self, cls: int, model: str | None = None) -> float:
        if model is not None:
            acc = self.by_model.get((cls, model))
            if acc is not None and acc[1] >= 5:
                return acc[0] / acc[1]
        m = self.means[cls]
        return self.overall if m != m else m  # NaN: not measured yet


SPREAD_WINDOW = 64  # the last this many sized requests of a class tell how their sizes erred
SPREAD_AFTER = 8  # ... once there were this many
SPREAD_EVERY = 8  # its range is worked out again after this many more


class SizeSpread:
    """Per class, how the service of requests that announced their size compared with
    what the size said: the range (5th to 95th percentile) of the ratio over the last
    :data:`SPREAD_WINDOW` of them. A running sized request is taken to end anywhere in
    that range of its expected service: an announced ``max_tokens`` is a bound that many
    requests stop short of, a client's size hint is off either way. Nothing is assumed
    until a class has :data:`SPREAD_AFTER` of them (its requests end when expected)."""

    def __init__(self, n_classes: int) -> None:
        self._ratios: list[list[float]] = [[] for _ in range(n_classes)]
        self._n = [0] * n_classes
        self.ranges: list[tuple[float, float] | None] = [None] * n_classes

    def record(self, cls: int, ratio: float) -> None:
        if not (0.0 < ratio < math.inf):
            return
        ratios = self._ratios[cls]
        n = self._n[cls]
        if len(ratios) < SPREAD_WINDOW:
            ratios.append(ratio)
        else:
            ratios[n % SPREAD_WINDOW] = ratio
        n = self._n[cls] = n + 1
        if n >= SPREAD_AFTER and not (n - SPREAD_AFTER) % SPREAD_EVERY:
            ordered = sorted(ratios)
            last = len(ordered) - 1
            self.ranges[cls] = (ordered[round(0.05 * last)], ordered[round(0.95 * last)])


class ArrivalRates:
    """Work arriving per class (service-seconds per second) over a sliding window
    of two buckets: the current one and the last complete one."""

    def __init__(self, n_classes: int, bucket_s: float = 120.0, long_s: float = 900.0) -> None:
        self.bucket_s = bucket_s
        self.index = 0
        self.cur = [0.0] * n_classes
        self.prev = [0.0] * n_classes
        # a moving average of the buckets' rates over about long_s: for waits longer than
        # the window, which a burst just past (or just begun) would mislead
        self.long = [0.0] * n_classes
        self._long_w = min(1.0, bucket_s / long_s)

    def roll(self, now: float) -> None:
        """Move the window to the bucket of ``now``."""
        index = int(now // self.bucket_s)
        if index != self.index:
            w = self._long_w
            gone = min(index - self.index, 64)  # buckets that ended (the later ones empty)
            for i, work in enumerate(self.cur):
                rate = self.long[i] * (1 - w) + w * work / self.bucket_s
                self.long[i] = rate * (1 - w) ** (gone - 1)
            self.prev = self.cur if index == self.index + 1 else [0.0] * len(self.cur)
            self.cur = [0.0] * len(self.cur)
            self.index = index

    def long_rate_before(self, cls: int, now: float) -> float:
        """Total rate of the classes more urgent than ``cls``, over the long window."""
        if int(now // self.bucket_s) != self.index:
            self.roll(now)
        return sum(self.long[:cls])

    def add(self, cls: int, work_s: float, now: float) -> None:
        if now // self.bucket_s != self.index:
            self.roll(now)
        self.cur[cls] += work_s

    def rate(self, cls: int, now: float) -> float:
        self.roll(now)
        span = self.bucket_s + (now - self.index * self.bucket_s)
        return (self.prev[cls] + self.cur[cls]) / span

    def rate_before(self, cls: int, now: float) -> float:
        """Total rate of the classes more urgent than ``cls``."""
        if int(now // self.bucket_s) != self.index:
            self.roll(now)
        span = self.bucket_s + (now - self.index * self.bucket_s)
        return (sum(self.prev[:cls]) + sum(self.cur[:cls])) / span


CALIBRATE_EVERY = 4  # one submission in this many is estimated on arrival, to learn from
CALIBRATE_AFTER = 8  # ... once its class has this many service times measured
CALIBRATION_FLOOR_S = 1.0  # waits and estimates both under this teach nothing


RANGE_AFTER = 16  # a class's range comes from how its estimates erred once it has this many
RANGE_WINDOW = 64  # ... over the last this many
RANGE_MISS = 0.2  # the share of waits an interval aims to miss (10th to 90th percentile)
RANGE_STEP = 0.05  # how fast the percentiles taken follow the misses seen (adaptive conformal)
RANGE_WIDEN = 3.0  # past the widest ratios seen, the bounds widen by e^(3 x the shortfall)
UNCALIBRATED = (1 / 3, 3.0)  # before that, the range around a raw estimate on measured service


@dataclass(frozen=True, slots=True)
class WaitRange:
    """An estimate's interval (``high_s`` ``inf``: no bound is known) and what it rests on
    (``basis``: one of :data:`BASES`, and ``detail`` saying it in words)."""

    low_s: float
    high_s: float
    basis: str
    detail: str


BASES = (
    "now",  # a slot is free for it: it starts at once
    "calibrated",  # the queue ahead, with how such estimates erred for the class lately
    "measured",  # the queue ahead and measured service times, not yet calibrated
    "configured",  # some of the work ahead is sized by a class's configured service_s only
    "none",  # some of the work ahead has no size, and its class no service measured: unknown
)


class Calibration:
    """Per class, the typical ratio of the wait that followed to the raw estimate given
    on arrival (a moving average of its logarithm), which new estimates are multiplied
    by. The raw formula knows the queue now but not what will happen meanwhile — aged
    work rising into the class, preempted work going back ahead of it, bursts of more
    urgent work — and errs the same way for a class while the traffic keeps its shape;
    the ratio follows it. It learns from the raw estimates only (never from corrected
    ones), so it cannot feed on itself."""

    def __init__(self, n_classes: int, weight: float = 0.05) -> None:
        self.weight = weight
        self.log = [0.0] * n_classes
        self.factor = [1.0] * n_classes
        self.n = [0] * n_classes
        # how the waits that followed compared with the raw estimates, per class
        self._spreads = [_Spread() for _ in range(n_classes)]
        self.watching: list[tuple[float, int, Any]] = []  # (interval's end, seq, request): a heap

    def learn(self, cls: int, raw_s: float, actual_s: float) -> None:
        floor = CALIBRATION_FLOOR_S
        if not math.isfinite(raw_s):
            return
        self._spreads[cls].add((actual_s + floor / 2) / (raw_s + floor / 2))
        if not (raw_s >= floor or actual_s >= floor):
            return
        ratio = math.log(max(actual_s, floor / 2) / max(raw_s, floor / 2))
        ratio = min(max(ratio, -3.0), 3.0)  # (one wild sample moves it a little, not off)
        n = self.n[cls] = self.n[cls] + 1
        w = max(self.weight, 1.0 / n)
        self.log[cls] += w * (ratio - self.log[cls])
        self.factor[cls] = math.exp(self.log[cls])

    def judge(self, cls: int, missed: bool) -> None:
        """A wait fell outside (or inside) the interval announced for it."""
        self._spreads[cls].judge(missed)

    def range_of(self, cls: int, raw_s: float) -> tuple[float, float] | None:
        """Where the wait behind a raw estimate ``raw_s`` falls 80 % of the time, as the
        class's estimates erred lately; ``None`` until it has :data:`RANGE_AFTER` of them."""
        bounds = self._spreads[cls].bounds()
        if bounds is None:
            return None
        f = CALIBRATION_FLOOR_S / 2
        return max((raw_s + f) * bounds[0] - f, 0.0), max((raw_s + f) * bounds[1] - f, 0.0)

    def watch(self, req: Any, cls: int, raw_s: float, now: float) -> None:
        """``req`` was estimated on arrival: its interval, to be judged when it starts (or
        as soon as it waited past its end)."""
        span = self.range_of(cls, raw_s)
        if span is not None:
            req.range_s = span
            heapq.heappush(self.watching, (now + span[1], req.seq, req))

    def overdue(self, now: float) -> None:
        """The requests that waited past their interval without starting: misses, now."""
        watching = self.watching
        while watching and watching[0][0] < now:
            req = heapq.heappop(watching)[2]
            if not req.range_judged and req.state is State.QUEUED and req.first_start_s != req.first_start_s:
                req.range_judged = True
                self.judge(req.priority, True)

    def started(self, req: Any, waited_s: float) -> None:
        """``req`` (estimated on arrival) started after ``waited_s``: its interval judged."""
        span = req.range_s
        if span is not None and not req.range_judged:
            req.range_judged = True
            self.judge(req.priority, not span[0] - 1e-9 <= waited_s <= span[1] + 1e-9)


class _Spread:
    """The last :data:`RANGE_WINDOW` ratios of wait to raw estimate of a class, and the
    share left out of its bounds (``alpha``, half on each side): it starts at the aim and
    moves by the misses — a wait that fell outside the interval announced for it widens
    them, one inside narrows them — so that traffic whose errors drift is still covered as
    aimed (adaptive conformal inference)."""

    __slots__ = ("alpha", "ratios", "seen", "sorted")

    def __init__(self) -> None:
        self.ratios: list[float] = []
        self.sorted: list[float] = []
        self.seen = 0
        self.alpha = RANGE_MISS

    def add(self, ratio: float) -> None:
        if len(self.ratios) < RANGE_WINDOW:
            self.ratios.append(ratio)
        else:
            self.ratios[self.seen % RANGE_WINDOW] = ratio
        self.seen += 1
        self.sorted = sorted(self.ratios)

    def judge(self, missed: bool) -> None:
        self.alpha = min(max(self.alpha + RANGE_STEP * (RANGE_MISS - missed), -1.0), 0.6)

    def bounds(self) -> tuple[float, float] | None:
        if self.seen < RANGE_AFTER:
            return None
        last = len(self.sorted) - 1
        tail = max(self.alpha, 0.0) / 2
        lo, hi = self.sorted[round(tail * last)], self.sorted[round((1 - tail) * last)]
        if self.alpha < 0.0:  # missing more than aimed with every ratio seen inside: wider still
            widen = math.exp(-self.alpha * RANGE_WIDEN)
            lo, hi = lo / widen, hi * widen
        return lo, hi


class Measures:
    """One scheduler's measurements (``costs``: replaced as checkpoints are measured)."""

    __slots__ = ("arrivals", "calibration", "costs", "service", "spread")

    def __init__(
        self, k: int, costs: CostModel, default_service_s: float, priors: Sequence[float | None]
    ) -> None:
        self.costs = costs
        self.service = ServiceStats(k, default_service_s, class_priors=priors)
        self.arrivals = ArrivalRates(k)
        self.calibration = Calibration(k)
        self.spread = SizeSpread(k)
