"""Every message of a cluster, as it travels through Redis: one typed record a kind, each
with its tag, and the one place that knows how each is laid out on the wire.

- *Events*, a replica to the leader (its stream of events, in order):
  :class:`Submitted` (``s``), :class:`Finished` (``f``), :class:`Cancelled` (``c``),
  :class:`Preempted` (``p``), :class:`Requeued` (``q``), :class:`Progress` (``g``),
  :class:`FirstToken` (``t``), :class:`Availability` (``a``), :class:`CacheSpace` (``v``),
  :class:`CacheLost` (``h``), :class:`SlotCap` (``x``),
  :class:`Pace` (``o``), :class:`SlotsWanted` (``w``), :class:`LoanTaken` (``u``), :class:`Census` (``K``),
  :class:`CachedOn` (``l``); of a fleet (their records in :mod:`laneway.cluster.fleet_messages`):
  ``Owns`` (``n``), ``EngineReady`` (``e``), ``EngineGone`` (``z``), ``ModelFailing`` (``b``),
  ``AdapterTook`` (``y``), ``AdapterFailed`` (``j``), ``Reload`` (``r``).
- *Orders*, the leader to a replica (its stream of decisions): the core's
  :class:`~laneway.core.Dispatch` (``D``), :class:`~laneway.core.Preempt` (``P``) and
  :class:`~laneway.core.Reject` (``R``), and :class:`LoanGranted` (``G``),
  :class:`CensusAsked` (``K``); to the replica that owns a fleet's node, the core's
  :class:`~laneway.core.Load` (``L``), :class:`~laneway.core.Evict` (``E``),
  :class:`~laneway.core.LoadAdapter` (``A``) and :class:`~laneway.core.UnloadAdapter` (``U``).
- :class:`TableEntry`: a live request in the leader's table (``PREFIX reqs``), written as
  a JSON object of named fields, so that an entry can gain a field without moving others
  (a table written as positional lists, by an earlier version, is read too).

On the wire an event or an order is a JSON list, its tag first: compact, as thousands a
second go through (most are :class:`~laneway.cluster.flat.Flat`: their fields in order).
:func:`encode` and :func:`decode` are the only code that indexes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from laneway.cluster.flat import Flat
from laneway.cluster.fleet_messages import (
    AdapterFailed,
    AdapterTook,
    EngineGone,
    EngineReady,
    ModelFailing,
    Owns,
    Reload,
)
from laneway.core import Dispatch, Evict, Load, Preempt, Reject, Request, StopMode
from laneway.core.decisions import LoadAdapter, UnloadAdapter


@dataclass(frozen=True, slots=True)
class Sent:
    """A request as a replica sent it to the leader (what the leader schedules it by)."""

    id: str
    home: str  # the replica that holds its client
    priority: int
    arrival_s: float  # the cluster's clock: the wall clock
    model: str | None = None
    tenant: str | None = None
    preemptible: bool = True
    timeout_s: float | None = None
    est_service_s: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    prefix: tuple[int, ...] = ()  # its prompt's block hashes (laneway.runtime.prefix)

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, tuple):  # (read back from JSON: a list)
            object.__setattr__(self, "prefix", tuple(self.prefix))

    @classmethod
    def of(cls, req: Request, home: str) -> Sent:
        return cls(
            req.id,
            home,
            req.priority,
            req.arrival_s,
            req.model,
            req.tenant,
            req.preemptible,
            req.timeout_s,
            req.est_service_s,
            req.prompt_tokens,
            req.output_tokens,
            req.prefix,
        )

    def request(self) -> Request:
        """A fresh core request of it (to submit or adopt)."""
        return Request(
            self.id,
            self.priority,
            self.arrival_s,
            model=self.model,
            tenant=self.tenant,
            preemptible=self.preemptible,
            timeout_s=self.timeout_s,
            est_service_s=self.est_service_s,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            prefix=self.prefix,
        )

    def to_wire(self) -> list[Any]:
        return [
            self.id,
            self.home,
            self.priority,
            self.arrival_s,
            self.model,
            self.tenant,
            self.preemptible,
            self.timeout_s,
            self.est_service_s,
            self.prompt_tokens,
            self.output_tokens,
            list(self.prefix),
        ]


_SENT_FIELDS = 12  # (positions of a Sent on the wire; one of 11, from an earlier version, has no prefix)


def _sent(items: list[Any]) -> Sent:
    return Sent(*items[:_SENT_FIELDS])


QUEUED, RUNNING = "q", "r"  # a table entry's state


@dataclass(frozen=True, slots=True)
class TableEntry:
    """A live request in the leader's table: as sent, and queued or running where."""

    sent: Sent
    state: str = QUEUED
    worker: str | None = None

    @property
    def running(self) -> bool:
        return self.state == RUNNING

    def queued(self) -> TableEntry:
        return TableEntry(self.sent, QUEUED, None)

    def on(self, worker: str) -> TableEntry:
        return TableEntry(self.sent, RUNNING, worker)

    def to_json(self) -> dict[str, Any]:
        """As the table keeps it: an object of named fields."""
        return {**asdict(self.sent), "state": self.state, "worker": self.worker}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | list[Any]) -> TableEntry:
        """An entry as the table keeps it (or as a list: :meth:`to_wire`, as an earlier
        version wrote the table)."""
        if isinstance(data, list):
            return cls.from_wire(data)
        fields = {k: data[k] for k in Sent.__dataclass_fields__ if k in data}
        return cls(Sent(**fields), data.get("state", QUEUED), data.get("worker"))

    def to_wire(self) -> list[Any]:
        """As a census sends it: the request as submitted (``s`` and its fields), its state
        and its worker."""
        return [Submitted.TAG, *self.sent.to_wire(), self.state, self.worker]

    @classmethod
    def from_wire(cls, items: list[Any]) -> TableEntry:
        n = len(items) - 3  # (the tag, the request's fields, its state and worker)
        return cls(_sent(items[1 : 1 + n]), items[1 + n], items[2 + n])


# ---------------------------------------------------------------------- events
@dataclass(frozen=True, slots=True)
class Submitted:
    TAG: ClassVar[str] = "s"
    sent: Sent

    def to_wire(self) -> list[Any]:
        return self.sent.to_wire()

    @classmethod
    def from_wire(cls, items: list[Any]) -> Submitted:
        return cls(_sent(items))


@dataclass(frozen=True, slots=True)
class Finished(Flat):
    TAG: ClassVar[str] = "f"
    request_id: str
    failed: bool = False
    tokens: int | None = None  # output tokens made (None: not told)
    prompt_tokens: int | None = None  # the engine's count of its prompt (None: not told)


@dataclass(frozen=True, slots=True)
class Cancelled(Flat):
    TAG: ClassVar[str] = "c"
    request_id: str
    tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Preempted(Flat):
    TAG: ClassVar[str] = "p"
    request_id: str
    tokens_done: int | None = None
    checkpoint_bytes: int | None = None
    save_s: float | None = None


@dataclass(frozen=True, slots=True)
class Requeued(Flat):
    TAG: ClassVar[str] = "q"
    request_id: str
    failed: bool = False  # (its worker failed: it waits its queue timeout anew)


@dataclass(frozen=True, slots=True)
class Progress(Flat):
    TAG: ClassVar[str] = "g"
    request_id: str
    tokens: int


@dataclass(frozen=True, slots=True)
class FirstToken(Flat):
    """A request made its first output token (its prompt is prefilled)."""

    TAG: ClassVar[str] = "t"
    request_id: str


@dataclass(frozen=True, slots=True)
class Availability(Flat):
    TAG: ClassVar[str] = "a"
    worker: str
    available: bool


@dataclass(frozen=True, slots=True)
class CacheSpace(Flat):
    """A replica learnt an engine's KV space in tokens (its prefix cache's bound)."""

    TAG: ClassVar[str] = "v"
    worker: str
    kv_tokens: int


@dataclass(frozen=True, slots=True)
class CacheLost(Flat):
    """A replica saw an engine lose its prefix cache (it restarted)."""

    TAG: ClassVar[str] = "h"
    worker: str


@dataclass(frozen=True, slots=True)
class SlotCap(Flat):
    """A replica adapted how many requests an engine of its node may run at once."""

    TAG: ClassVar[str] = "x"
    worker: str
    slots: int


@dataclass(frozen=True, slots=True)
class Pace(Flat):
    """A replica measured the decode pace of a model."""

    TAG: ClassVar[str] = "o"
    model: str
    tokens: int
    seconds: float


@dataclass(frozen=True, slots=True)
class SlotsWanted(Flat):
    """A replica had a request of ``model`` that could have started on a lent slot."""

    TAG: ClassVar[str] = "w"
    home: str
    model: str

    @classmethod
    def from_wire(cls, items: list[Any]) -> SlotsWanted:
        return cls(items[0], items[1] or "")  # (a request of no model asks as "")


@dataclass(frozen=True, slots=True)
class LoanTaken(Flat):
    """A replica applied a loan's figure ``seq`` on ``worker`` and uses ``used`` of its slots."""

    TAG: ClassVar[str] = "u"
    home: str
    worker: str
    seq: int
    used: int


@dataclass(frozen=True, slots=True)
class CachedOn(Flat):
    """A replica started a request on a lent slot of ``worker``: its prompt's blocks are
    likely in that engine's prefix cache now (the leader's index learns it)."""

    TAG: ClassVar[str] = "l"
    worker: str
    prefix: tuple[int, ...]

    def to_wire(self) -> list[Any]:
        return [self.worker, list(self.prefix)]

    @classmethod
    def from_wire(cls, items: list[Any]) -> CachedOn:
        return cls(str(items[0]), tuple(int(b) for b in items[1]))


@dataclass(frozen=True, slots=True)
class Census:
    """What ``home``'s requests do now, answering the census ``census_id`` a leader asked."""

    TAG: ClassVar[str] = "K"
    census_id: str
    home: str
    entries: tuple[TableEntry, ...] = field(default=())

    def to_wire(self) -> list[Any]:
        return [self.census_id, self.home, [e.to_wire() for e in self.entries]]

    @classmethod
    def from_wire(cls, items: list[Any]) -> Census:
        return cls(str(items[0]), str(items[1]), tuple(TableEntry.from_wire(e) for e in items[2]))


Event = (
    Submitted
    | Finished
    | Cancelled
    | Preempted
    | Requeued
    | Progress
    | FirstToken
    | CacheSpace
    | CacheLost
    | SlotCap
    | Availability
    | Pace
    | SlotsWanted
    | LoanTaken
    | Census
    | CachedOn
    | Owns
    | EngineReady
    | EngineGone
    | ModelFailing
    | AdapterTook
    | AdapterFailed
    | Reload
)


# ---------------------------------------------------------------------- orders
@dataclass(frozen=True, slots=True)
class LoanGranted(Flat):
    """The leader lends ``slots`` slots of ``worker`` in all (figure number ``seq``)."""

    TAG: ClassVar[str] = "G"
    worker: str
    slots: int
    seq: int


@dataclass(frozen=True, slots=True)
class CensusAsked(Flat):
    """A new leader asks what this replica's requests do."""

    TAG: ClassVar[str] = "K"
    census_id: str


Order = Dispatch | Preempt | Reject | LoanGranted | CensusAsked | Load | Evict | LoadAdapter | UnloadAdapter


def _inf(v: float | None) -> float:
    return math.inf if v is None else float(v)


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


_DECISION_TAGS: dict[type, str] = {
    Dispatch: "D",
    Preempt: "P",
    Reject: "R",
    Load: "L",
    Evict: "E",
    LoadAdapter: "A",
    UnloadAdapter: "U",
}


def _decision_wire(d: Dispatch | Preempt | Reject | Load | Evict | LoadAdapter | UnloadAdapter) -> list[Any]:
    if type(d) is Reject:
        # (an infinite wait is not JSON: None on the wire, infinite again once read)
        return [d.request_id, d.reason, d.message, _finite(d.estimated_wait_s), _finite(d.retry_after_s)]
    return list(d)


def _gpus(v: Any) -> tuple[str, ...]:
    return tuple(str(g) for g in v)


def encode(msg: Event | Order) -> list[Any]:
    """A message as it goes on the wire: its tag, then its fields in order."""
    tag = _DECISION_TAGS.get(type(msg))
    if tag is not None:
        return [tag, *_decision_wire(msg)]  # type: ignore[arg-type]
    return [msg.TAG, *msg.to_wire()]  # type: ignore[union-attr]


_EVENTS: dict[str, Callable[[list[Any]], Event]] = {
    c.TAG: c.from_wire
    for c in (
        Submitted,
        Finished,
        Cancelled,
        Preempted,
        Requeued,
        Progress,
        FirstToken,
        Availability,
        CacheSpace,
        CacheLost,
        SlotCap,
        Pace,
        SlotsWanted,
        LoanTaken,
        Census,
        CachedOn,
        Owns,
        EngineReady,
        EngineGone,
        ModelFailing,
        AdapterTook,
        AdapterFailed,
        Reload,
    )
}
_ORDERS: dict[str, Callable[[list[Any]], Order]] = {
    "D": lambda e: Dispatch(e[0], e[1], None if e[2] is None else StopMode(e[2])),
    "P": lambda e: Preempt(e[0], e[1], StopMode(e[2]), e[3]),
    "R": lambda e: Reject(e[0], e[1], e[2], _inf(e[3]), _inf(e[4])),
    "L": lambda e: Load(str(e[0]), str(e[1]), _gpus(e[2]), float(e[3]), bool(e[4])),
    "E": lambda e: Evict(str(e[0]), str(e[1]), _gpus(e[2]), bool(e[3])),
    "A": lambda e: LoadAdapter(str(e[0]), str(e[1]), float(e[2])),
    "U": lambda e: UnloadAdapter(str(e[0]), str(e[1])),
    LoanGranted.TAG: LoanGranted.from_wire,
    CensusAsked.TAG: CensusAsked.from_wire,
}


class BadMessage(ValueError):
    """Not a message this version knows (an unknown tag, or fields missing)."""


def decode_event(items: list[Any]) -> Event:
    """An event from its wire form."""
    return _decode(items, _EVENTS)


def decode_order(items: list[Any]) -> Order:
    """An order (a decision or a loan or a census asked) from its wire form."""
    return _decode(items, _ORDERS)


def _decode(items: list[Any], kinds: Mapping[str, Callable[[list[Any]], Any]]) -> Any:
    if not isinstance(items, list) or not items:
        raise BadMessage(f"not a message: {items!r:.80}")
    make = kinds.get(items[0])
    if make is None:
        raise BadMessage(f"unknown message kind {items[0]!r}")
    try:
        return make(items[1:])
    except (IndexError, TypeError, ValueError) as exc:
        raise BadMessage(f"a {items[0]!r} message with bad fields: {exc}") from None
