"""Slots lent to replicas, model-checked: the leader's core (a real Scheduler holding what
it lends), two replicas' borrowers, and the messages between them delivered late and in
any interleaving (in order from each sender). Whatever happens, no worker ever runs
more requests than its slots — the leader's and the replicas' lent ones together — and
every loan is back once the replicas' requests end."""

from __future__ import annotations

from collections import deque
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from laneway.cluster.codec import LoanGranted, LoanTaken
from laneway.cluster.lending import AFFINITY_BLOCKS, Borrower, Lender, starts_itself
from laneway.core import Dispatch, Request, Scheduler, WorkerSpec
from laneway.core.admission import Quota, TenantPolicy
from laneway.core.prefix_cache import PrefixIndex

SPECS = [WorkerSpec("w0", 4), WorkerSpec("w1", 3)]
HOMES = ("a", "b")
# (kind, replica, a class / which request / how many messages: 0 for all there are)
op = st.tuples(
    st.sampled_from(["arrive"] * 3 + ["end"] * 2 + ["leader"] * 2 + ["step"] * 2 + ["deliver"] * 2 + ["die"]),
    st.sampled_from(HOMES),
    st.integers(0, 3),
)


class Cluster:
    def __init__(self) -> None:
        self.core = Scheduler(SPECS)
        self.lender = Lender(SPECS, reserve=1)
        self.borrowers = {h: Borrower(SPECS) for h in HOMES}
        self.to_leader: dict[str, deque[list[Any]]] = {h: deque() for h in HOMES}
        self.to_replica: dict[str, deque[list[Any]]] = {h: deque() for h in HOMES}
        self.on_worker = dict.fromkeys((w.id for w in SPECS), 0)  # what the upstreams run
        self.runs: dict[str, tuple[str, str, bool]] = {}  # request -> (home, worker, lent)
        self.wanting: dict[str, set[str]] = {}
        self.sent: dict[str, set[str]] = {h: set() for h in HOMES}  # through the leader
        self.n = 0
        self.now = 0.0

    def check(self) -> None:
        for w in SPECS:
            assert self.on_worker[w.id] <= w.slots, (w.id, self.on_worker, self.lender.loans)
            assert self.core.workers[w.id].held == self.lender.held(w.id)
        self.core.check_invariants()

    def arrive(self, home: str, cls: int) -> None:
        self.n += 1
        rid = f"{home}{self.n}"
        req = Request(rid, cls, self.now)
        w = self.borrowers[home].take(req)
        if w is not None:
            self.on_worker[w] += 1
            self.runs[rid] = (home, w, True)
        else:
            self.to_leader[home].append(["w", home])
            self.to_leader[home].append(["s", req])
            self.sent[home].add(rid)

    def end(self, home: str, k: int) -> None:
        mine = sorted(rid for rid, (h, _, _) in self.runs.items() if h == home)
        if not mine:
            return
        rid = mine[k % len(mine)]
        _, w, lent = self.runs.pop(rid)
        self.on_worker[w] -= 1  # the upstream is done with it at once
        if lent:
            b, report = self.borrowers[home].give_back(home, rid)
            assert b is not None and b.worker == w
            if report is not None:
                self.to_leader[home].append(report)
        else:
            self.to_leader[home].append(["f", rid])

    def leader(self, home: str, n: int = 1) -> None:
        for _ in range(n or len(self.to_leader[home])):
            if self.to_leader[home]:
                self.read(home, self.to_leader[home].popleft())

    def read(self, home: str, e: Any) -> None:
        if isinstance(e, LoanTaken):
            self.lender.report(e.home, e.worker, e.seq, e.used)
            self.core.hold(e.worker, self.lender.held(e.worker))
        elif e[0] == "s":
            assert self.core.submit(e[1], self.now) is None
            self.sent[home].add(e[1].id)
        elif e[0] == "f":
            self.core.finished(e[1], self.now)
        elif e[0] == "w":
            self.wanting.setdefault(home, set()).add("")
        else:
            raise AssertionError(f"not an event of this model: {e!r}")

    def step(self) -> None:
        self.now += 1.0
        for d in self.core.schedule(self.now):
            if type(d) is not Dispatch:
                continue  # (a queue timeout)
            home = d.request_id[0]
            self.on_worker[d.worker_id] += 1
            self.runs[d.request_id] = (home, d.worker_id, False)
        free = {w: s.free for w, s in self.core.workers.items()}
        msgs = self.lender.plan(free, self.wanting, self.core.queued > 0, set(), {})
        self.wanting = {}
        for home, m in msgs:
            self.to_replica[home].append(m)
        for w in self.core.workers:
            self.core.hold(w, self.lender.held(w))

    def deliver(self, home: str, n: int = 1) -> None:
        for _ in range(n or len(self.to_replica[home])):
            if self.to_replica[home]:
                m = self.to_replica[home].popleft()
                self.to_leader[home].append(self.borrowers[home].granted(home, m.worker, m.slots, m.seq))

    def die(self, home: str) -> None:
        for rid, (h, w, _) in list(self.runs.items()):
            if h == home:
                del self.runs[rid]
                self.on_worker[w] -= 1  # (its connections to the upstreams close with it)
                if rid in self.core:
                    self.core.cancel(rid, self.now)
        for rid in self.sent[home]:  # (the leader's reaper cancels what the core has of it)
            if rid in self.core:
                self.core.cancel(rid, self.now)
        self.sent[home].clear()
        self.to_leader[home].clear()
        self.to_replica[home].clear()
        self.lender.drop([home])
        for w in self.core.workers:
            self.core.hold(w, self.lender.held(w))
        self.borrowers[home] = Borrower(SPECS)  # (it restarts as a new replica)


@settings(max_examples=400, deadline=None)
@given(st.lists(op, min_size=30, max_size=150))
def test_lent_and_placed_requests_never_exceed_a_workers_slots(ops: list[tuple[str, str, int]]) -> None:
    c = Cluster()
    for kind, home, k in ops:
        if kind == "arrive":  # a burst of k + 1 (of class k)
            for _ in range(k + 1):
                c.arrive(home, k)
        elif kind == "end":
            c.end(home, k)
        elif kind == "leader":
            c.leader(home, k)
        elif kind == "step":
            c.step()
        elif kind == "deliver":
            c.deliver(home, k)
        else:
            c.die(home)
        c.check()
    # everything ends and every message is delivered: every loan comes back once lowered
    for _ in range(200):
        for home in HOMES:
            while c.runs and any(h == home for h, _, _ in c.runs.values()):
                c.end(home, 0)
            while c.to_replica[home] or c.to_leader[home]:
                c.deliver(home)
                c.leader(home)
        for i in range(c.core.free_slots + 1):  # something waits: loans go to 0
            c.core.submit(Request(f"a-late{_}.{i}", 0, c.now), c.now)
        c.step()
        c.check()
        if not c.lender.loans and not c.runs and not any(c.to_replica.values()):
            break
    assert not c.lender.loans, c.lender.loans
    assert all(s.held == 0 for s in c.core.workers.values())


def test_loans_grow_to_a_share_and_stop_short_of_the_reserve() -> None:
    lender = Lender([WorkerSpec("w", 16)], reserve=2)
    free = {"w": 16}
    sent: dict[str, int] = {}
    for _ in range(6):
        for home, m in lender.plan(free, {"a": {""}, "b": {""}}, False, set(), {}):
            sent[home] = m.slots
        free = {"w": 16 - lender.held("w")}
    assert sent == {"a": 7, "b": 7}  # (16 - 2 reserved) ÷ 2 replicas
    assert lender.held("w") == 14
    out = lender.plan(free, {}, True, set(), {})  # something waits: every loan goes to 0
    assert sorted((h, m.slots) for h, m in out) == [("a", 0), ("b", 0)]
    assert lender.held("w") == 14  # held until the replicas confirm
    lender.report("a", "w", lender.loans[("a", "w")].seq, 3)
    assert lender.held("w") == 10  # a still uses 3
    lender.report("a", "w", lender.loans[("a", "w")].seq, 0)
    lender.drop(["b"])
    assert lender.held("w") == 0 and not lender.loans


def test_an_isolated_worker_lends_nothing() -> None:
    """What runs beside what on it is the leader's to say (a request started on a lent
    slot is not known to the leader's core)."""
    lender = Lender([WorkerSpec("w", 16, isolate=True), WorkerSpec("v", 16)], reserve=2)
    out = lender.plan({"w": 16, "v": 16}, {"a": {""}}, False, set(), {})
    assert [(h, m.worker) for h, m in out] == [("a", "v")]
    assert lender.held("w") == 0


def test_only_requests_the_leader_need_not_count_start_under_lent_slots() -> None:
    assert starts_itself(None, 0)
    assert starts_itself(TenantPolicy(), 2)
    assert not starts_itself(TenantPolicy(quotas={0: Quota(2.0)}), 0)
    assert starts_itself(TenantPolicy(quotas={0: Quota(2.0)}), 1)
    assert not starts_itself(TenantPolicy(max_concurrent=4), 2)
    assert not starts_itself(TenantPolicy(allowed=frozenset({3})), 2)  # the leader refuses it


def test_a_replica_over_its_share_is_lowered_to_it_when_another_asks() -> None:
    lender = Lender([WorkerSpec("w", 9)], reserve=1)
    for _ in range(4):  # a alone asks, again and again: up to every slot but the reserve
        lender.plan({"w": 9 - lender.held("w")}, {"a": {""}}, False, set(), {})
    assert lender.loans[("a", "w")].sent == 8
    out = lender.plan({"w": 9 - lender.held("w")}, {"b": {""}}, False, set(), {})
    assert [(h, m.slots) for h, m in out] == [("a", 4)]  # nothing left for b: a down to its share
    lender.report("a", "w", lender.loans[("a", "w")].seq, 1)  # a uses 1
    out = lender.plan({"w": 9 - lender.held("w")}, {"b": {""}}, False, set(), {})
    assert [(h, m.slots) for h, m in out] == [("b", 2)]


def test_a_replica_that_may_have_been_taken_for_dead_starts_nothing_on_lent_slots() -> None:
    b = Borrower(SPECS)
    b.granted("a", "w0", 2, 1)
    b.valid_until = 10.0
    assert b.take(Request("r1", 2, 0.0), now=5.0) == "w0"
    assert b.take(Request("r2", 2, 0.0), now=11.0) is None  # (its liveness is not known fresh)
    b.valid_until = 20.0  # a heartbeat again
    assert b.take(Request("r3", 2, 0.0), now=12.0) == "w0"


def test_a_loan_that_ended_and_begins_again_is_used_and_comes_back() -> None:
    lender, borrower = Lender([WorkerSpec("w", 4)], reserve=1), Borrower([WorkerSpec("w", 4)])

    def deliver(out: list[tuple[str, LoanGranted]]) -> None:
        for home, m in out:
            t = borrower.granted(home, m.worker, m.slots, m.seq)
            lender.report(t.home, t.worker, t.seq, t.used)

    for round_ in range(3):  # lent, called back to nothing (the loan ends), lent again
        deliver(lender.plan({"w": 4 - lender.held("w")}, {"a": {""}}, False, set(), {}))
        assert borrower.take(Request(f"r{round_}", 2, 0.0)) == "w", round_
        deliver(lender.plan({"w": 4 - lender.held("w")}, {}, True, set(), {}))
        assert lender.held("w") == 1  # r still runs on it
        _, report = borrower.give_back("a", f"r{round_}")
        assert report is not None
        lender.report(report.home, report.worker, report.seq, report.used)
        assert lender.held("w") == 0 and not lender.loans, (round_, lender.loans)


def test_a_quarantine_outlives_its_home_taken_for_dead_again_and_grows() -> None:
    """A home taken for dead keeps the slots of its requests held until the engine shows
    them gone (``release``); late events that have it taken for dead again neither end
    that hold (they did, and a paused runner's batch lines ran twice at once) nor shrink it."""
    lender = Lender([WorkerSpec("w", 8)], reserve=1)
    lender.lend("a", "w", 2)
    lender.quarantine("a", "w", 6, until=100.0)
    lender.drop(["a"])
    assert lender.held("w") == 6 and lender.quarantined()
    lender.quarantine("a", "w", 1, until=50.0)  # one more of its requests found running
    assert lender.held("w") == 7 and lender.quarantined()[("a", "w")].until == 100.0
    lender.release("a", "w")
    assert lender.held("w") == 0 and not lender.loans


def test_a_request_on_a_lent_slot_goes_where_its_prompt_is_likely_cached() -> None:
    specs = [WorkerSpec("w0", 4), WorkerSpec("w1", 4)]
    b = Borrower(specs, index=PrefixIndex({w.id: None for w in specs}))
    b.granted("a", "w0", 3, 1)
    b.granted("a", "w1", 2, 1)
    agent = tuple(range(11, 11 + AFFINITY_BLOCKS))
    assert b.take(Request("r0", 2, 0.0, prefix=(21, 22))) == "w0"  # a short prompt: the most spare
    b.give_back("a", "r0")
    assert b.take(Request("r1", 2, 0.0, prefix=agent)) is None  # long, not known here: the leader's
    b.index.record("w1", agent)  # ... the leader placed it on w1  # type: ignore[union-attr]
    assert b.take(Request("r2", 2, 0.0, prefix=(*agent, 99))) == "w1"  # most of it there
    assert b.take(Request("r3", 2, 0.0, prefix=(11, *range(90, 90 + AFFINITY_BLOCKS)))) is None
    assert b.take(Request("r4", 2, 0.0, prefix=(*agent, 98))) == "w1"
    assert b.take(Request("r5", 2, 0.0, prefix=(*agent, 97))) is None  # w1's lent slots are used up
    assert b.take(Request("r6", 2, 0.0, prefix=(31,))) == "w0"
    assert b.used == {"w0": 1, "w1": 2}


def test_the_leaders_index_learns_a_prompt_started_on_a_lent_slot() -> None:
    sched = Scheduler([WorkerSpec("w0", 4), WorkerSpec("w1", 4)])
    agent = (11, 12, 13, 14)
    sched.cached_on("w1", agent)
    sched.submit(Request("r1", 2, 0.0, prefix=(*agent, 15)), 0.0)
    sched.submit(Request("r2", 2, 0.0), 0.0)  # (w0 is now the less loaded)
    placed = {d.request_id: d.worker_id for d in sched.schedule(0.0) if isinstance(d, Dispatch)}
    assert placed == {"r1": "w1", "r2": "w0"}
