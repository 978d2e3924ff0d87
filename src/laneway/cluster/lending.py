"""Slots the leader lends to replicas, so that short requests start without a round trip.

Through the leader, a request costs its replica an event out, a decision back and
an event at its end, and the leader a read, a scheduling step and a write; when
the upstreams have slots to spare, that is all overhead. So the leader lends
spare slots: while nothing waits in its queues, a replica that asks (it sent a
request that could have started itself) is lent some of a worker's free slots,
which the leader's core then holds (:meth:`laneway.core.Scheduler.hold`). The
replica starts a request on a lent slot at once and tells the leader nothing of
it; the slot is its own again when the request ends.

What a replica may start itself: a request expected to take at most
``local_max_s`` (the leader cannot preempt it: it does not know it), with no
dependency, whose tenant has no quota, token quota or concurrency cap for its
class (those are counted by the leader, exactly, across replicas).

Lending stops as soon as something waits: the leader lowers every loan to 0
and holds, for each replica, what it still uses (the replica says so as its
requests end) until it is all back. A worker's ``reserve`` slots are never lent,
so that urgent work the leader places finds a slot at once; an ``isolate`` worker's are
never lent at all (the leader keeps batch work from running beside urgent work there).

The figures are absolute and numbered: a replica may start a request on a worker
only while its count there is below the last figure it was sent; the leader
holds for it at least that figure, and after lowering one, what the replica
last said it uses, until the replica confirms the new figure. So at any moment
the requests running on a worker (the leader's and every replica's lent ones)
are at most its slots. :class:`Lender` is the leader's side, :class:`Borrower`
a replica's; both are pure bookkeeping, and a model-based test checks the bound.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from laneway.cluster.codec import LoanGranted, LoanTaken
from laneway.core import Request, Scheduler, WorkerSpec
from laneway.core.admission import TenantPolicy
from laneway.core.prefix_cache import PrefixIndex

ASKED_FOR_S = 2.0  # a replica that asked for slots is lent what comes free for this long
# a prompt of this many blocks (256 tokens) or more starts on a lent slot only where this
# replica knows it is likely cached; else the leader places it (it knows every replica's)
AFFINITY_BLOCKS = 8


@dataclass(slots=True)
class Loan:
    """What the leader lent one replica on one worker; or, once the replica was taken for
    dead, the slots its requests may still hold there (a *quarantine*: ``until`` > 0)."""

    sent: int = 0  # slots lent: the last figure sent
    seq: int = 0  # that figure's number
    used: int = 0  # slots the replica said it uses, when it confirmed ``seq`` or since
    hold: int = 0  # slots held for it in the core
    until: float = 0.0  # a quarantine's end at the latest (wall clock); 0: a loan

    def to_list(self) -> list[float]:
        return [self.sent, self.seq, self.used, self.hold, self.until]


class Lender:
    """The leader's loans, per (replica, worker), and what to lend next."""

    def __init__(self, specs: Sequence[WorkerSpec], reserve: int) -> None:
        self.slots = {w.id: w.slots for w in specs}
        # never lent (and a worker of fewer slots lends none; an isolated worker lends none:
        # what runs beside what there is the leader's to say)
        self.reserve = {w.id: w.slots if w.isolate else min(w.slots, reserve) for w in specs}
        self.loans: dict[tuple[str, str], Loan] = {}
        self.changed: set[tuple[str, str]] = set()  # since the last write (to the table in Redis)
        self.last_seq: dict[tuple[str, str], int] = {}  # of loans that ended too
        self.asks: dict[str, dict[str, float]] = {}  # replica -> model -> when it last asked

    def held(self, worker: str) -> int:
        return sum(loan.hold for (_, w), loan in self.loans.items() if w == worker)

    def lend(self, home: str, worker: str, n: int) -> LoanGranted:
        """Lend ``home`` ``n`` slots of ``worker`` (in all): the message to send it."""
        key = (home, worker)
        loan = self.loans.get(key)
        if loan is None:  # (numbers go on from the loan's last one, if it ended)
            loan = self.loans[key] = Loan(seq=self.last_seq.get(key, 0))
        loan.sent = n
        loan.seq += 1
        self.last_seq[key] = loan.seq
        loan.hold = max(loan.hold, n)  # lowered only once the replica confirms
        self.changed.add((home, worker))
        return LoanGranted(worker, n, loan.seq)

    def report(self, home: str, worker: str, seq: int, used: int) -> None:
        """``home`` applied figure ``seq`` on ``worker`` and uses ``used`` of its slots."""
        loan = self.loans.get((home, worker))
        if loan is None or seq != loan.seq:
            return  # (a newer figure is on its way: its confirmation will come)
        loan.used = used
        hold = max(loan.sent, used)
        if hold != loan.hold:
            loan.hold = hold
            self.changed.add((home, worker))
        if hold == 0 and loan.sent == 0:
            del self.loans[(home, worker)]
            self.changed.add((home, worker))

    def drop(self, homes: Iterable[str]) -> None:
        """Replicas that are gone: their loans end (their requests died with them). Their
        quarantines stay: only :meth:`release` ends one (a home taken for dead again, by its
        late events, still has its requests running at the engine until it shows them gone)."""
        gone = set(homes)
        for key in [k for k, loan in self.loans.items() if k[0] in gone and loan.until == 0]:
            del self.loans[key]
            self.changed.add(key)
        for key in [k for k in self.last_seq if k[0] in gone]:
            del self.last_seq[key]
        for home in gone:
            self.asks.pop(home, None)

    def quarantine(self, home: str, worker: str, n: int, until: float) -> None:
        """``home`` was taken for dead with ``n`` requests on ``worker`` (its own and lent
        ones): their slots stay held until the engine shows them gone or ``until``. A
        process that only stood still (a pause) still has them running there. A quarantine
        there already grows by ``n``, and lasts as long as the later of the two."""
        old = self.loans.get((home, worker))
        if old is not None and old.until > 0:
            n += old.hold
            until = max(until, old.until)
        self.loans[(home, worker)] = Loan(used=n, hold=n, until=until)
        self.changed.add((home, worker))

    def quarantined(self) -> dict[tuple[str, str], Loan]:
        return {k: loan for k, loan in self.loans.items() if loan.until > 0}

    def release(self, home: str, worker: str) -> None:
        """A quarantine ends: its slots are the core's again."""
        if (home, worker) in self.loans:
            del self.loans[(home, worker)]
            self.changed.add((home, worker))

    def homes(self) -> set[str]:
        """The replicas lent slots now (not those in quarantine: they were taken for dead)."""
        return {h for (h, _), loan in self.loans.items() if loan.until == 0}

    def lent_out(self, worker: str) -> int:
        """Slots of ``worker`` held for live replicas."""
        return sum(loan.hold for (_, w), loan in self.loans.items() if w == worker and loan.until == 0)

    def restore(self, table: Mapping[str, list[int]], workers: Iterable[str]) -> None:
        """The loans a leader before wrote (``"home|worker"`` -> :meth:`Loan.to_list`), on
        the workers still configured."""
        known = set(workers)
        self.loans.clear()
        self.last_seq.clear()
        self.asks.clear()
        for key, figures in table.items():
            home, _, worker = key.rpartition("|")
            if worker in known:
                sent, seq, used, hold, *rest = figures
                self.loans[(home, worker)] = Loan(int(sent), int(seq), int(used), int(hold), *rest)

    def hold_in(self, core: Scheduler) -> list[tuple[str, int, int]]:
        """Make ``core`` hold what is lent on each worker, as far as its slots are free (a
        worker configured smaller since lends less): those short, (worker, lent, held)."""
        short = []
        for w, state in core.workers.items():
            held = self.held(w)
            if held != state.held:
                room = state.held + state.free
                core.hold(w, min(held, room))
                if held > room:
                    short.append((w, held, room))
        return short

    def ask(self, home: str, model: str, now: float) -> None:
        """``home`` had a request of ``model`` that could have started on a lent slot."""
        self.asks.setdefault(home, {})[model] = now

    def asking(self, now: float) -> dict[str, set[str]]:
        """The replicas that asked within :data:`ASKED_FOR_S` -> the models they asked for."""
        out = {}
        for home, models in list(self.asks.items()):
            fresh = {m for m, t in models.items() if now - t < ASKED_FOR_S}
            if fresh:
                out[home] = fresh
            else:
                del self.asks[home]
        return out

    def answered(self, messages: Iterable[tuple[str, LoanGranted]]) -> None:
        """Replicas lent more are no longer asking (they ask again if they need more)."""
        for home, m in messages:
            if m.slots > 0:
                self.asks.pop(home, None)

    def plan(
        self,
        free: Mapping[str, int],
        wanting: Mapping[str, set[str]],
        contested: bool,
        down: set[str],
        serves: Mapping[str, set[str]],
    ) -> list[tuple[str, LoanGranted]]:
        """The messages to send now: every loan to 0 while something waits (``contested``)
        and on workers taken out (``down``); else more of ``free`` (slots the core has
        free, per worker) to the replicas ``wanting`` (home -> models it asked for) on the
        workers that serve those models (``serves``: worker -> models; empty: any)."""
        out: list[tuple[str, LoanGranted]] = []
        for (home, w), loan in list(self.loans.items()):
            if loan.sent > 0 and loan.until == 0 and (contested or w in down):
                out.append((home, self.lend(home, w, 0)))
        if contested or not wanting:
            return out
        for w, slots in self.slots.items():
            if w in down:
                continue
            models = serves.get(w) or set()
            asking = sorted(h for h, ms in wanting.items() if not models or ms & models)
            if not asking:
                continue
            borrowers = {
                h for (h, v), loan in self.loans.items() if v == w and loan.sent > 0 and not loan.until
            }
            cap = max(1, (slots - self.reserve[w]) // max(1, len(borrowers | set(asking))))
            lendable = free.get(w, 0) - self.reserve[w]
            for home in asking:
                sent = self.loans[(home, w)].sent if (home, w) in self.loans else 0
                more = min(cap - sent, lendable, max(sent, 2))  # (doubling up to its share)
                if more <= 0:
                    continue
                lendable -= more
                out.append((home, self.lend(home, w, sent + more)))
            if lendable <= 0:  # others may hold more than their share: down to it (they
                for h in sorted(borrowers - set(asking)):  # give back what they do not use)
                    if self.loans[(h, w)].sent > cap:
                        out.append((h, self.lend(h, w, cap)))
        return out


def starts_itself(policy: TenantPolicy | None, cls: int) -> bool:
    """Whether a tenant's requests of class ``cls`` may start under lent slots: nothing
    the leader must count (a quota, a token quota or a concurrency cap) applies."""
    if policy is None:
        return True
    return (
        (policy.allowed is None or cls in policy.allowed)
        and cls not in policy.quotas
        and cls not in policy.token_quotas
        and policy.max_concurrent is None
        and policy.max_queued is None
    )


@dataclass(slots=True)
class Borrowed:
    worker: str
    req: Request


@dataclass
class Borrower:
    """A replica's side: the slots lent to it per worker, and its requests on them.

    With placement by prefix (``index``), a request goes to the worker whose lent slot is
    where its prompt is likely cached, by what this replica saw: where the leader placed
    its requests, and where it started them on lent slots (the leader hears of those,
    :class:`~laneway.cluster.codec.CachedOn`, so that its own index knows them too). A long
    prompt (:data:`AFFINITY_BLOCKS`) that this replica does not know to be cached on a lent
    slot goes to the leader, whose index has every replica's prompts."""

    specs: Sequence[WorkerSpec]
    lent: dict[str, int] = field(default_factory=dict)  # worker -> slots lent
    seq: dict[str, int] = field(default_factory=dict)
    used: dict[str, int] = field(default_factory=dict)
    running: dict[str, Borrowed] = field(default_factory=dict)  # request id -> where
    down: set[str] = field(default_factory=set)  # workers this replica saw fail
    # (monotonic) until when the leader cannot have taken this replica for dead: past it,
    # no new request starts on a lent slot (a replica paused past its liveness lost them)
    valid_until: float = math.inf
    index: PrefixIndex | None = None  # where its prompts are likely cached (placement "prefix")

    def granted(self, home: str, worker: str, n: int, seq: int) -> LoanTaken:
        """The leader lends ``n`` slots of ``worker`` (figure ``seq``): the confirmation.
        Figures come in the order they were sent (one stream), so the last one holds,
        whatever its number (a loan that ended and began again numbers afresh)."""
        self.lent[worker] = n
        self.seq[worker] = seq
        return LoanTaken(home, worker, seq, self.used.get(worker, 0))

    def take(self, req: Request, now: float = 0.0) -> str | None:
        """A lent slot for ``req`` (its worker, now counted as used), or ``None``; ``now``
        on the clock of :attr:`valid_until`."""
        if now > self.valid_until:
            return None
        best, room = None, 0
        index, blocks = self.index, req.prefix
        cached, held = None, 0  # the worker that likely holds the most of its prompt
        for spec in self.specs:
            w = spec.id
            spare = self.lent.get(w, 0) - self.used.get(w, 0)
            if spare > 0 and w not in self.down and spec.serves(req.model) and spec.admits(req.priority):
                if spare > room:
                    best, room = w, spare
                if index is not None and blocks:
                    m = index.matched(w, blocks)
                    if m > held:
                        cached, held = w, m
        if best is None:
            return None
        if index is not None and len(blocks) >= AFFINITY_BLOCKS:  # a prompt worth its cache:
            if cached is None or 2 * held < len(blocks):  # not known here to be cached on a
                return None  # slot lent to it: the leader, which knows all, places it
            best = cached
        if index is not None and blocks:
            index.record(best, blocks)
        self.used[best] = self.used.get(best, 0) + 1
        self.running[req.id] = Borrowed(best, req)
        return best

    def give_back(self, home: str, request_id: str) -> tuple[Borrowed | None, LoanTaken | None]:
        """``request_id`` ended (or left): its slot is free again. The request (if it ran on
        a lent slot) and the report to send (when the leader waits for that slot)."""
        b = self.running.pop(request_id, None)
        if b is None:
            return None, None
        w = b.worker
        before = self.used[w]
        self.used[w] = before - 1
        if before > self.lent.get(w, 0):  # over the figure: the leader holds it until told
            return b, LoanTaken(home, w, self.seq.get(w, 0), before - 1)
        return b, None

    def running_per_class(self, names: Sequence[str]) -> dict[str, int]:
        out = dict.fromkeys(names, 0)
        for b in self.running.values():
            out[names[b.req.priority]] += 1
        return out
