"""The lanes (an in-order deque plus an out-of-order heap per lane) against a
plain reference: random pushes, takes, head pops, requeues and reclasses."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from laneway.core import Request
from laneway.core.aging import aged_rank
from laneway.core.lanes import Lanes
from laneway.core.selection import select_strict

N_CLASSES = 4
MODELS = (None, "m1")

# an op: (kind, a, b) with small ints that pick classes, models, times and victims
OPS = st.lists(
    st.tuples(
        st.sampled_from(["push", "push", "push", "take", "pop", "requeue", "reclass"]),
        st.integers(0, 7),
        st.integers(0, 7),
    ),
    max_size=80,
)


def _key(req: Request) -> tuple[float, int]:
    return (req.arrival_s, req.seq)


class Model:
    """Lanes driven the way the scheduler drives them, with the expected state beside."""

    def __init__(self, levels: int = 1, ceilings: list[int] | None = None) -> None:
        self.lanes = Lanes(N_CLASSES, levels, False, ceilings, lane_counts=True)
        self.queued: list[Request] = []
        self.seq = 0

    def push(self, cls: int, model: str | None, arrival: float) -> None:
        req = Request(f"r{self.seq}", cls, arrival, model=model)
        req.seq, req.cls, req.tag = self.seq, cls, arrival  # (the tag: its arrival, as without tenants)
        self.seq += 1
        self.lanes.push(req)
        self.queued.append(req)

    def head_of(self, lane: int) -> Request | None:
        inside = [r for r in self.queued if r.lane == lane]
        return min(inside, key=_key) if inside else None

    def check(self) -> None:
        lanes = self.lanes
        assert lanes.total == len(self.queued)
        for c in range(N_CLASSES):
            assert lanes.class_count[c] == sum(1 for r in self.queued if r.cls == c)
        for lane, entry in enumerate(lanes.heads):
            expected = self.head_of(lane)
            assert lanes.count[lane] == sum(1 for r in self.queued if r.lane == lane)
            if expected is None:
                assert entry is None
                assert not any(e[2] == e[3].gen for e in [*lanes.fifos[lane], *lanes.sides[lane]])
            else:
                assert entry is not None and entry[3] is expected and entry[2] == expected.gen
            # both fronts are valid entries; the deque is in order
            fifo, side = lanes.fifos[lane], lanes.sides[lane]
            assert not fifo or fifo[0][2] == fifo[0][3].gen
            assert not side or side[0][2] == side[0][3].gen
            assert list(fifo) == sorted(fifo, key=lambda e: (e[0], e[1], e[2]))


def _run(ops: list[tuple[str, int, int]]) -> Model:
    m = Model()
    for kind, a, b in ops:
        live_lanes = [lane for lane, e in enumerate(m.lanes.heads) if e is not None]
        if kind == "push":
            # arrivals mostly rise (the common case), some come earlier than the tail
            arrival = float(m.seq) if b < 5 else float(m.seq) - 3.5 * b
            m.push(a % N_CLASSES, MODELS[b % 2], arrival)
        elif kind == "take" and m.queued:
            req = m.queued.pop(a * 7 % len(m.queued))
            m.lanes.take(req)
        elif kind in ("pop", "requeue") and live_lanes:
            lane = live_lanes[a % len(live_lanes)]
            req = m.head_of(lane)
            assert req is not None
            m.lanes.pop_head(req)
            m.queued.remove(req)
            if kind == "requeue":  # preempted: back in with its arrival and seq, ahead of later ones
                m.lanes.push(req)
                m.queued.append(req)
        elif kind == "reclass" and m.queued:
            req = m.queued[a * 5 % len(m.queued)]
            m.lanes.take(req)
            req.cls = b % N_CLASSES
            m.lanes.push(req)
        m.check()
    return m


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_lanes_keep_the_first_request_of_every_lane(ops: list[tuple[str, int, int]]) -> None:
    _run(ops)


@settings(max_examples=200, deadline=None)
@given(OPS, st.floats(0.0, 400.0), st.sets(st.integers(0, 2 * N_CLASSES - 1), max_size=3))
def test_strict_selection_is_the_lowest_aged_key(
    ops: list[tuple[str, int, int]], now: float, blocked: set[int]
) -> None:
    """select_strict (a scan that stops early) equals a brute-force minimum of
    (aged rank, arrival, seq) over every queued request of an unblocked lane."""
    interval, ceilings = 60.0, [0, 1, 2, 2]
    m = Model(ceilings=ceilings)
    for kind, a, b in ops:  # pushes and head pops only: the selection is the subject
        if kind == "pop" and m.queued:
            req = select_strict(m.lanes, now, set(), interval)
            assert req is not None
            m.lanes.pop_head(req)
            m.queued.remove(req)
        else:
            m.push(a % N_CLASSES, MODELS[b % 2], float(a * 13 % 50))
    got = select_strict(m.lanes, now, blocked, interval)
    candidates = [r for r in m.queued if r.lane not in blocked]
    if not candidates:
        assert got is None
        return

    def aged(r: Request) -> tuple[int, float, int]:
        return (aged_rank(r.cls, now - r.arrival_s, interval, ceilings[r.cls]), r.arrival_s, r.seq)

    assert got is min(candidates, key=aged)


def test_a_requeued_request_goes_back_ahead_of_later_arrivals() -> None:
    m = Model()
    for t in range(3):
        m.push(2, None, float(t))
    first = m.head_of(2)
    assert first is not None
    m.lanes.pop_head(first)
    m.queued.remove(first)
    m.lanes.push(first)  # preempted and requeued: out of order, into the side heap
    m.queued.append(first)
    m.check()
    assert m.lanes.head(2) is first and len(m.lanes.sides[2]) == 1
