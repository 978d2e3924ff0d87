"""Property tests on GPU fleets: random inventories (1-3 nodes of 1-4 GPUs,
16-80 GB, random KV reserves and class reservations), random models (1-4 GPUs,
sizes that sometimes fit nowhere), LoRA adapters of some of them, and random
request streams, under the
``laneway`` and ``naive`` placements.

After every step: ``check_invariants`` (VRAM never over-committed, the KV
reserve held, multi-GPU replicas on one node, workers == ready replicas) and
the driver's own books (``GpuDriver``: loads, evictions and dispatches checked
against what it has seen). After draining: every submitted request ended
exactly once, and only requests for models no GPU group could hold were
refused as unplaceable."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, currently_in_test_context, given, note, settings
from hypothesis import strategies as st

from laneway.core import ConfigError, Dispatch, Scheduler, SchedulerConfig, State
from laneway.core.decisions import REJECT_REASONS
from laneway.core.gpu_placement import GpuPlacement
from laneway.core.inventory import GpuSpec, Inventory, ModelSpec

from .gpu_helpers import GpuDriver, greq

PROPS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- strategies ---------------------------------------------------------------------
_RESERVED: list[frozenset[int] | None] = [None] * 3 + [frozenset({0, 1}), frozenset({0}), frozenset({2, 3})]
_KV = [0.0, 0.0, 0.05, 0.1, 0.25]

gpu_st = st.tuples(
    st.sampled_from([16.0, 24.0, 24.0, 40.0, 48.0, 80.0]) | st.floats(16.0, 80.0),
    st.sampled_from(_KV),
    st.sampled_from(_RESERVED),
)
nodes_st = st.lists(st.lists(gpu_st, min_size=1, max_size=4), min_size=1, max_size=3)
model_st = st.tuples(
    st.sampled_from([1, 1, 1, 2, 4]) | st.integers(1, 4),  # GPUs
    # GB per GPU: over 80 (or past the KV reserve) fits nowhere; 10-40 contends
    st.sampled_from([6.0, 10.0, 14.0, 14.0, 20.0, 20.0, 30.0, 40.0, 70.0, 90.0]) | st.floats(4.0, 90.0),
    st.sampled_from([0.0, 0.0, 1.0, 5.0, 30.0, 60.0]),  # load_s
    st.sampled_from([1, 1, 2, 4]),  # slots
)
models_st = st.lists(model_st, min_size=1, max_size=4)


@dataclass(frozen=True)
class Fleet:
    inv: Inventory
    switch_wait_s: float


# tight fleets: few small GPUs, models that crowd them (evictions, drains, switches)
tight_nodes_st = st.lists(
    st.lists(
        st.tuples(st.sampled_from([16.0, 24.0]), st.sampled_from(_KV), st.sampled_from(_RESERVED)),
        min_size=1,
        max_size=2,
    ),
    min_size=1,
    max_size=2,
)
tight_models_st = st.lists(
    st.tuples(
        st.sampled_from([1, 1, 2]),
        st.sampled_from([6.0, 8.0, 12.0, 14.0, 20.0]),
        st.sampled_from([0.0, 1.0, 5.0, 30.0]),
        st.sampled_from([1, 2]),
    ),
    min_size=2,
    max_size=4,
)


@st.composite
def fleets(draw: st.DrawFn, tight: bool = False) -> Fleet:
    gpus = []
    for n, node in enumerate(draw(tight_nodes_st if tight else nodes_st)):
        for i, (vram, kv, reserved) in enumerate(node):
            gpus.append(GpuSpec(f"n{n}g{i}", f"n{n}", vram, round(vram * kv, 3), reserved))
    models = {}
    for i, (k, per_gpu, load_s, slots) in enumerate(draw(tight_models_st if tight else models_st)):
        wake_s = draw(st.sampled_from([None, 0.0, 2.0]))  # (a sleep mode: evicted, it sleeps)
        most = draw(st.sampled_from([1, 1, 2]))  # adapters one replica holds at once
        models[f"m{i}"] = ModelSpec(f"m{i}", per_gpu * k, k, load_s, slots, wake_s, max_adapters=most)
    n_bases = len(models)
    for j in range(draw(st.sampled_from([0, 0, 1, 2, 3]))):  # LoRA adapters of drawn bases
        base = f"m{draw(st.integers(0, n_bases - 1))}"
        load_s = draw(st.sampled_from([0.0, 0.5, 2.0]))
        models[f"a{j}"] = ModelSpec(f"a{j}", 0.0, load_s=load_s, adapter_of=base)
    bases = [m for m in models if m.startswith("m")]
    preload = tuple(bases[i] for i in draw(st.lists(st.integers(0, len(bases) - 1), max_size=3)))
    asleep = draw(st.sampled_from([0, 1, 2]))
    inv = Inventory(tuple(gpus), models, preload, asleep)
    try:
        GpuPlacement(inv)
    except ConfigError:  # the preloads do not fit together: start empty
        inv = Inventory(tuple(gpus), models, (), asleep)
    return Fleet(inv, draw(st.sampled_from([5.0, 60.0])))


config_st = st.builds(
    SchedulerConfig,
    aging_interval_s=st.sampled_from([None, 30.0]),
    drain_cap_s=st.sampled_from([0.5, 30.0]),
    max_preemptions=st.integers(0, 3),
)

# An event is one integer, decoded below (one draw per event keeps generation cheap).
_KINDS = ["submit"] * 8 + ["finish"] * 3 + ["ack"] * 2 + ["cancel"] + ["advance"] * 3 + ["loaded", "offline"]
_TIMEOUTS = [None, None, None, 5.0, math.inf]
_HINTS = [None, None, 1.0, 30.0, 300.0]
_STEPS = [0.0, 0.1, 1.0, 5.0, 20.0, 70.0]


def decode(n: int) -> tuple[object, ...]:
    kind = _KINDS[n % len(_KINDS)]
    n //= len(_KINDS)
    if kind == "submit":
        cls, n = n % 4, n // 4
        m, n = n % 8, n // 8  # one of the fleet's models (or adapters), or (7) one it does not know
        timeout, n = _TIMEOUTS[n % len(_TIMEOUTS)], n // len(_TIMEOUTS)
        hint, n = _HINTS[n % len(_HINTS)], n // len(_HINTS)
        return ("submit", cls, m, timeout, hint, n % 4 != 3)
    if kind == "finish":
        return ("finish", n % 41, (n // 41) % 5 == 4)
    if kind == "advance":
        return ("advance", _STEPS[n % len(_STEPS)])
    if kind == "offline":  # (a cluster's nodes with no live owner: a mask of the fleet's nodes)
        return ("offline", n % 8)
    return (kind, n % 41)


events_st = st.lists(st.integers(0, 2**31 - 1), min_size=10, max_size=50).map(
    lambda ns: [decode(n) for n in ns]
)


# -- the driver loop -------------------------------------------------------------------
def agree(d: GpuDriver) -> None:
    """The driver's books and the placement's agree (beyond ``check_invariants``)."""
    p = d.placement
    assert set(p.replicas) == set(d.replica_model), "replicas: placement and driver differ"
    assert {rid for rid, r in p.replicas.items() if r.ready} == d.ready
    held = d.held()
    for gid, used in p.vram.used.items():
        assert abs(used - held[gid]) < 1e-6, (gid, used, held[gid])
    for rid, w in d.running.items():
        model = d.model_of[rid]
        assert model is not None
        assert p.replicas[w].model.name == p.inv.base(model).name, f"{rid} runs on a replica of another model"
        if model != p.replicas[w].model.name:  # (an adapter: held where it runs)
            assert model in p.adapters.resident.get(w, {}) and model in d.adapters.get(w, ()), (rid, w, model)
    for rid, held in d.adapters.items():  # (the placement holds what the driver saw loaded)
        assert set(p.adapters.resident.get(rid, {})) == held, (rid, p.adapters.resident.get(rid), held)


def run(fleet: Fleet, cfg: SchedulerConfig, policy: str, events: list[tuple[object, ...]]) -> GpuDriver:
    if currently_in_test_context():
        note(f"gpus: {fleet.inv.gpus}")
        note(f"models: {list(fleet.inv.models.values())}, preload: {fleet.inv.preload}")
        note(f"events: {events}")
    placement = GpuPlacement(fleet.inv, naive=policy == "naive", switch_wait_s=fleet.switch_wait_s)
    d = GpuDriver(Scheduler([], cfg, policy, placement=placement))
    names = sorted(fleet.inv.models)
    nodes = sorted(fleet.inv.nodes)
    offline: set[str] = set()
    for ev in events:
        kind = ev[0]
        loads = len(d.loads)
        if kind == "submit":
            _, cls, m, timeout, hint, preemptible = ev
            name = names[m % len(names)] if m < 7 else "unknown"  # type: ignore[operator]
            rid = f"r{len(d.submitted)}"
            r = greq(rid, cls, d.now, name, timeout_s=timeout, est_service_s=hint, preemptible=preemptible)  # type: ignore[arg-type]
            rej = d.submit(r)
            never = fleet.inv.never(name, cls)  # type: ignore[arg-type]
            if never is not None:
                assert rej is not None and rej.reason == "unplaceable", (rid, never, rej)
                assert name in rej.message
            else:
                assert rej is None or rej.reason != "unplaceable", rej
            if rej is not None:
                assert rej.reason in REJECT_REASONS and r.state is State.REJECTED
        elif kind == "finish":
            if d.running:
                d.finish(sorted(d.running)[ev[1] % len(d.running)], failed=bool(ev[2]))  # type: ignore[operator]
        elif kind == "ack":
            if d.stopping:
                d.ack(sorted(d.stopping)[ev[1] % len(d.stopping)])  # type: ignore[operator]
        elif kind == "cancel":
            if d.submitted:
                d.cancel(d.submitted[ev[1] % len(d.submitted)])  # type: ignore[operator]
        elif kind == "loaded":  # the runtime ends a load early (a warm cache, say)
            if d.loading:
                d.load_done(sorted(d.loading)[ev[1] % len(d.loading)])  # type: ignore[operator]
        elif kind == "offline":
            offline = {node for i, node in enumerate(nodes) if ev[1] >> i & 1}  # type: ignore[operator]
            d.sched.set_offline(offline)
        else:
            d.advance(ev[1])  # type: ignore[arg-type]
        d.step()
        agree(d)
        on = {fleet.inv.gpus[i].id: fleet.inv.gpus[i].node for i in range(len(fleet.inv.gpus))}
        placed_offline = [x for _, x in d.loads[loads:] if on[x.gpu_ids[0]] in offline]
        assert placed_offline == [], f"loaded on offline nodes {sorted(offline)}: {placed_offline}"
    d.sched.set_offline(set())  # (every node back: what waits for one is served)
    d.drain()
    agree(d)
    return d


# -- the properties ------------------------------------------------------------------------
def check_ends(
    fleet: Fleet, cfg: SchedulerConfig, policy: str, events: list[tuple[object, ...]]
) -> GpuDriver:
    d = run(fleet, cfg, policy, events)
    s = d.sched
    assert s.live == 0 and s.queued == 0
    assert not d.running and not d.stopping
    assert set(d.ended) == set(d.submitted)  # and each once: the driver refuses a second end
    c = s.counters
    snap = s.snapshot()
    assert snap.submitted == len(d.submitted)
    assert sum(snap.completed.values()) == sum(1 for h in d.ended.values() if h == "finished")
    assert c.model_loads == len(d.loads) == d.placement.loads
    assert d.placement.evictions == len(d.evictions)
    # every replica left is ready and idle; all slots free again
    assert not d.loading
    assert s.free_slots == s.slots == sum(r.model.slots for r in d.placement.replicas.values())
    # each dispatch went to a ready replica of the request's model on GPUs that admit
    # its class, each load was for unserved queued demand (checked as they came)
    assert all(type(x) is Dispatch for _, x in d.dispatches)
    return d


@pytest.mark.parametrize("policy", ["laneway", "naive"])
@PROPS
@given(fleet=fleets(), cfg=config_st, events=events_st)
def test_gpu_invariants_hold_and_every_request_ends_exactly_once(
    policy: str, fleet: Fleet, cfg: SchedulerConfig, events: list[tuple[object, ...]]
) -> None:
    check_ends(fleet, cfg, policy, events)


@pytest.mark.parametrize("policy", ["laneway", "naive"])
@PROPS
@given(fleet=fleets(tight=True), cfg=config_st, events=events_st)
def test_gpu_invariants_hold_on_crowded_gpus(
    policy: str, fleet: Fleet, cfg: SchedulerConfig, events: list[tuple[object, ...]]
) -> None:
    """Few small GPUs, several models that crowd them: loads, evictions, drains
    and switches all the time."""
    check_ends(fleet, cfg, policy, events)


def test_models_that_load_in_no_time_fill_a_fleet_one_load_after_another() -> None:
    """Found by the property test: nine P0 requests on nine free GPUs, a model that loads in
    0 s, naive placement — one load per step, all at t = 0. That is progress, not a spin."""
    gpus = ["n0g0", *(f"n1g{i}" for i in range(4)), *(f"n2g{i}" for i in range(4))]
    inv = Inventory(
        gpus=tuple(GpuSpec(id=g, node=g[:2], vram_gb=16.0) for g in gpus),
        models={"m0": ModelSpec(name="m0", vram_gb=6.0, gpus=1, load_s=0.0, slots=2)},
        preload=(),
    )
    cfg = SchedulerConfig(aging_interval_s=None, drain_cap_s=0.5, max_preemptions=0)
    events = [decode(0)] * 9 + [decode(5270)]
    d = check_ends(Fleet(inv=inv, switch_wait_s=5.0), cfg, "naive", events)
    assert len(d.loads) >= 5


def test_naive_placement_loads_on_an_online_node_and_runs_there_without_churning() -> None:
    """Found by the property test: the first idle GPU in order was on a node offline, so
    naive placement chose "load it there" while the load went to the online GPU, whose
    replica, idle, was evicted for the next load of the same model, and so on forever at
    t = 0."""
    inv = Inventory(
        gpus=tuple(GpuSpec(id=g, node=g[:2], vram_gb=16.0) for g in ("n0g0", "n1g0")),
        models={f"m{i}": ModelSpec(name=f"m{i}", vram_gb=6.0, gpus=1, load_s=0.0, slots=1) for i in (0, 1)},
        preload=(),
    )
    cfg = SchedulerConfig(aging_interval_s=None, drain_cap_s=0.5, max_preemptions=0)
    events = [("offline", 1)] + [decode(0)] * 6 + [("advance", 0.0)]
    d = check_ends(Fleet(inv=inv, switch_wait_s=5.0), cfg, "naive", events)
    # one load on the online node; the other node's GPU only once it is back (run's end)
    assert [x.gpu_ids for _, x in d.loads][:1] == [("n1g0",)] and len(d.loads) <= 2
    assert d.dispatches[0] == (0.0, Dispatch("r0", "m0#1@n1g0")) and not d.evictions
