"""The discrete-event simulator: a virtual clock, simulated workers, and the
same :class:`~laneway.core.Scheduler` the server runs.

An event heap of ``(time, order, seq, kind, payload)``; at each instant every
event due is applied to the scheduler, then ``schedule(now)`` is called once
and its decisions are carried out by the simulated workers:

- a dispatch runs the request's remaining service, after a restore cost when it
  resumes (checkpoint: KV bytes over the host link; recompute: re-prefill of
  prompt plus output so far; see :mod:`laneway.core.costs`);
- a preemption stops it at the next token boundary and, in checkpoint mode,
  holds the slot while the KV cache is copied to the host.

On upstreams with prefix caches (``caches=True``, :mod:`laneway.sim.engines`) a
request's first run prefills only what its engine does not hold, after the engine's
other prefills: its time to first token and the tokens it found cached are kept.
"""

from __future__ import annotations

import gc
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from laneway.core import (
    CostModel,
    Dispatch,
    Preempt,
    Reject,
    Request,
    Scheduler,
    SchedulerConfig,
    StopMode,
    WaitRange,
    WorkerSpec,
)
from laneway.core.decisions import Evict, Load, LoadAdapter, UnloadAdapter, apply
from laneway.core.errors import LanewayError
from laneway.core.gpu_placement import GpuPlacement
from laneway.core.inventory import Inventory
from laneway.core.policies import policy as policy_spec
from laneway.sim.engines import Engines
from laneway.sim.workload import SimRequest

# event order at one instant: slots free first (and first tokens), then arrivals, then timers
_FINISH, _STOPPED, _LOADED, _FIRST, _ARRIVAL, _WAKE = 0, 1, 2, 3, 4, 5
_MAX_STEPS_AT_ONE_INSTANT = 100_000
ESTIMATE_ALL = 200_000  # a livelock guard: the clock must move on


class SimulationError(LanewayError, RuntimeError):
    """The simulation cannot go on (a scheduler that stops making progress)."""


@dataclass(slots=True)
class Outcome:
    """What happened to one simulated request."""

    spec: SimRequest
    req: Request
    estimate_s: float = math.nan  # NaN: no estimate was asked for this one
    estimate_range: WaitRange | None = None  # ... and its interval
    status: str = "queued"  # finished / rejected / expired / ...
    reason: str | None = None
    end_s: float = math.nan
    remaining_s: float = 0.0
    run_start_s: float = math.nan
    overhead_s: float = 0.0
    token: int = 0
    tokens_done: int = 0
    gpus: tuple[str, ...] = ()  # GPU runs: where the current run is
    worker: str = ""  # where the current run is
    ttft_s: float = math.nan  # prefix-cache runs: arrival to first token
    cached_tokens: int = 0  # ... and the prompt tokens its engine held

    @property
    def first_wait_s(self) -> float:
        return self.req.first_start_s - self.spec.arrival_s

    @property
    def wait_s(self) -> float:
        """Total time spent queued (first wait plus waits after preemptions)."""
        return self.req.queued_total_s

    @property
    def latency_s(self) -> float:
        return self.end_s - self.spec.arrival_s


@dataclass
class SimResult:
    policy: str
    scenario: str
    slots: int
    seed: int | None
    outcomes: list[Outcome]
    scheduler: Scheduler
    makespan_s: float
    busy_s: float
    depth: list[tuple[float, tuple[int, ...]]]  # (time, queued per class) samples
    # GPU runs only: the GPU ids and what happened on them, as
    # ("run", gpus, start, end, model, class, request id), ("load", gpus, start, end, model),
    # ("evict", gpus, t, model) and ("preempt", gpus, t, model, class)
    gpus: list[str] = field(default_factory=list)
    timeline: list[tuple[Any, ...]] = field(default_factory=list)
    inventory: Inventory | None = None  # GPU runs: the fleet
    engines: Engines | None = None  # upstreams with prefix caches


def service_time(spec: SimRequest, costs: CostModel) -> float:
    """Service time from ``duration_s``, else from tokens and the speed model."""
    if spec.duration_s is not None:
        return spec.duration_s
    prompt = spec.prompt_tokens or costs.default_prompt_tokens
    return prompt / costs.prefill_tokens_s + spec.output_tokens / costs.decode_tokens_s


def service_hint(spec: SimRequest, costs: CostModel) -> float | None:
    """What the scheduler is told in advance: an estimate from the token counts
    (like ``max_tokens`` on a live request), never the true duration."""
    if not spec.output_tokens:
        return None
    prompt = spec.prompt_tokens or costs.default_prompt_tokens
    return prompt / costs.prefill_tokens_s + spec.output_tokens / costs.decode_tokens_s


def make_workers(slots: int) -> list[WorkerSpec]:
    return [WorkerSpec(f"w{i}", 1) for i in range(slots)]


class Simulation:
    def __init__(
        self,
        requests: Sequence[SimRequest],
        *,
        slots: int,
        policy: str = "laneway",
        config: SchedulerConfig | None = None,
        workers: Sequence[WorkerSpec] | None = None,
        scenario: str = "trace",
        seed: int | None = None,
        depth_every_s: float = 5.0,
        check: bool = False,
        inventory: Inventory | None = None,
        caches: bool = False,
    ) -> None:
        self.check = check  # assert the scheduler's invariants after every step
        self.cfg = config or SchedulerConfig()
        self.costs = self.cfg.costs
        self.gpu: GpuPlacement | None = None
        if inventory is not None:  # GPUs and models: replicas come and go with loads
            self.gpu = GpuPlacement(inventory, naive=policy_spec(policy).placement == "naive")
            self.workers: list[WorkerSpec] = []
            self.slots = len(inventory.gpus)
            self.sched = Scheduler([], self.cfg, policy, placement=self.gpu)
        else:
            self.workers = list(workers) if workers is not None else make_workers(slots)
            self.slots = sum(w.slots for w in self.workers)
            self.sched = Scheduler(self.workers, self.cfg, policy)
        # upstreams with prefix caches: their engines' caches and prefill
        self.engines = Engines(self.workers, self.costs.prefill_tokens_s) if caches else None
        self.timeline: list[tuple[Any, ...]] = []
        # LoRA adapters loading into replicas: (replica, adapter) -> when it is in (its
        # requests dispatched before then start then)
        self._adapter_ready: dict[tuple[str, str], float] = {}
        self.policy = policy
        self.scenario = scenario
        self.seed = seed
        self.requests = list(requests)
        self.depth_every_s = depth_every_s
        self._heap: list[tuple[float, int, int, int, object]] = []
        self._outcomes: dict[str, Outcome] = {}
        self._seq = 0
        self.busy_s = 0.0

    def _push(self, t: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, kind, payload))

    def run(self) -> SimResult:
        # A run allocates millions of long-lived objects (requests, outcomes,
        # events) and no reference cycles: the cyclic garbage collector would
        # only scan them over and over (a quarter of a 10^6-request run), so it
        # pauses until the run ends.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if collecting:
                gc.enable()

    def _run(self) -> SimResult:
        sched = self.sched
        outcomes = self._outcomes
        order: list[Outcome] = []
        # arrivals are fed lazily from the sorted list, not all pushed at once
        reqs = sorted(self.requests, key=lambda r: r.arrival_s)
        next_arrival = 0
        n = len(reqs)
        heap = self._heap
        wake_at = math.inf
        depth: list[tuple[float, tuple[int, ...]]] = []
        next_depth = 0.0
        k = len(self.cfg.classes)
        now = 0.0
        last_end = 0.0
        stuck = 0
        # wait estimates are asked at submission: of every request in runs up to
        # ESTIMATE_ALL requests, of an evenly spread sample above (they cost ~10 %)
        sample = max(1, n // ESTIMATE_ALL)
        costs = self.costs
        check = self.check
        busy = self.busy_s
        inf = math.inf
        heappop = heapq.heappop
        run: Outcome  # (a run that ends or stops: its outcome, and its token)
        token: int
        # stop when nothing is left to arrive or to end (timer events may remain)
        while next_arrival < n or (heap and sched.live):
            t_heap = heap[0][0] if heap else inf
            t_arr = reqs[next_arrival].arrival_s if next_arrival < n else inf
            t = t_arr if t_arr < t_heap else t_heap
            if t > now:
                stuck = 0
            else:
                stuck += 1
                if stuck > _MAX_STEPS_AT_ONE_INSTANT:
                    raise SimulationError(f"the simulation made no progress at t={now:.6f} s")
            now = t
            if now >= next_depth:  # the queues as they stood at each sample time up to now
                counts = tuple(sched.lanes.class_count[:k])
                every = self.depth_every_s
                while now >= next_depth:
                    depth.append((next_depth, counts))
                    step = next_depth + every
                    if now - step > every:  # a quiet stretch (a trace of epoch times): its
                        step += math.floor((now - step) / every) * every  # last sample
                    if step <= next_depth:  # (past a float's precision: none more before now)
                        step = math.nextafter(now, math.inf)
                    next_depth = step
            # 1. slot-freeing events due now
            while heap and heap[0][0] <= now and heap[0][1] < _ARRIVAL:
                _, kind, _, _, payload = heappop(heap)
                if kind == _LOADED:
                    sched.loaded(payload, now)  # type: ignore[arg-type]
                    continue
                run, token = payload  # type: ignore[misc]
                if token != run.token:
                    continue  # a run that was preempted: stale
                if kind == _FIRST:  # its prefill ended on its engine
                    sched.first_token(run.req.id, now)
                    continue
                if self.gpu is not None:
                    self._ran(run, now)
                busy += now - run.run_start_s
                if kind == _FINISH:
                    if self.engines is not None:
                        self.engines.finished(run.worker, run.spec.prefix, run.spec.reply)
                    made = run.tokens_done + sched.costs.generated_in(now - run.run_start_s)
                    sched.finished(run.req.id, now, tokens=made)
                    run.status = "finished"
                    run.end_s = now
                    last_end = now
                else:
                    sched.preempted(run.req.id, now, tokens_done=run.tokens_done)
            # 2. arrivals due now
            while next_arrival < n and reqs[next_arrival].arrival_s <= now:
                spec = reqs[next_arrival]
                next_arrival += 1
                req = Request(
                    spec.id,
                    spec.priority,
                    spec.arrival_s,
                    model=spec.model,
                    tenant=spec.tenant,
                    preemptible=spec.preemptible,
                    timeout_s=spec.timeout_s,
                    prompt_tokens=spec.prompt_tokens,
                    output_tokens=spec.output_tokens,
                    est_service_s=service_hint(spec, costs),
                    prefix=spec.prefix,
                )
                out = Outcome(spec, req, remaining_s=service_time(spec, costs))
                if next_arrival % sample == 0:
                    out.estimate_s, out.estimate_range = sched.estimate_range(
                        spec.priority, spec.model, now, req.est_service_s
                    )
                outcomes[spec.id] = out
                order.append(out)
                rejected = sched.submit(req, now)
                if rejected is not None:
                    self.reject(rejected, now)
            # 3. timers due now
            while heap and heap[0][0] <= now:
                heappop(heap)
            decisions = sched.schedule(now)
            if check:
                sched.check_invariants()
            if decisions:
                apply(decisions, self, now)
            wake = sched.next_wakeup()
            if wake < inf and (wake < wake_at or wake_at <= now):
                wake_at = max(wake, now)
                self._push(wake_at, _WAKE, None)
        self.busy_s = busy
        depth.append((now, tuple(sched.lanes.class_count[:k])))
        return SimResult(
            policy=self.policy,
            scenario=self.scenario,
            slots=self.slots,
            seed=self.seed,
            outcomes=order,
            scheduler=sched,
            makespan_s=last_end,
            busy_s=self.busy_s,
            depth=depth,
            gpus=[g.id for g in self.gpu.inv.gpus] if self.gpu is not None else [],
            timeline=self.timeline,
            inventory=self.gpu.inv if self.gpu is not None else None,
            engines=self.engines,
        )

    def _ran(self, out: Outcome, now: float) -> None:
        req = out.req
        self.timeline.append(("run", out.gpus, out.run_start_s, now, req.model, req.priority, req.id))

    # ------------------------------------------------------------------ decisions (an Actuator)
    def reject(self, decision: Reject, now: float) -> None:
        out = self._outcomes[decision.request_id]
        out.status = "expired" if decision.reason == "queue_timeout" else "rejected"
        out.reason = decision.reason
        out.end_s = now

    def load(self, decision: Load, now: float) -> None:
        self._push(now + decision.load_s, _LOADED, decision.replica_id)
        self.timeline.append(("load", decision.gpu_ids, now, now + decision.load_s, decision.model))

    def evict(self, decision: Evict, now: float) -> None:
        self.timeline.append(("evict", decision.gpu_ids, now, decision.model))

    def load_adapter(self, decision: LoadAdapter, now: float) -> None:
        key = (decision.replica_id, decision.adapter)
        # (loads into one replica's engine run one after another)
        start = max([now, *(t for (rid, _), t in self._adapter_ready.items() if rid == key[0])])
        self._adapter_ready[key] = start + decision.load_s

    def unload_adapter(self, decision: UnloadAdapter, now: float) -> None:
        self._adapter_ready.pop((decision.replica_id, decision.adapter), None)

    def dispatch(self, decision: Dispatch, now: float) -> None:
        out = self._outcomes[decision.request_id]
        req = out.req
        costs = self.costs
        overhead = 0.0
        if self._adapter_ready:  # its adapter is still loading there: it starts once it is in
            ready = self._adapter_ready.get((decision.worker_id, req.model))  # type: ignore[arg-type]
            if ready is not None and ready > now:
                overhead = ready - now
        engines = self.engines
        prefill = engines is not None and math.isnan(out.ttft_s)
        first_at = now
        if engines is not None and prefill:  # its first token to come: prefill
            spec = out.spec
            prompt = spec.prompt_tokens or costs.default_prompt_tokens
            worker = decision.worker_id
            first, out.cached_tokens = engines.start(worker, spec.prefix, prompt, now, req.id)
            # its prefill as the engine runs it, in place of the one from the speed model (a
            # given duration_s is taken as its generation alone)
            modelled = prompt / costs.prefill_tokens_s if spec.duration_s is None else 0.0
            out.remaining_s += first - modelled
            out.ttft_s = now - spec.arrival_s + first
            first_at = now + first
        elif decision.resume is not None:
            held = costs.tokens_held(req.prompt_tokens, req.tokens_done)
            overhead += (
                costs.restore_s(held) if decision.resume is StopMode.CHECKPOINT else costs.recompute_s(held)
            )
        out.token += 1
        out.run_start_s = now
        out.overhead_s = overhead
        out.worker = decision.worker_id
        if self.gpu is not None:
            out.gpus = self.gpu.replicas[decision.worker_id].gpus
        self._push(now + overhead + out.remaining_s, _FINISH, (out, out.token))
        if prefill:  # (the core hears of its first token)
            self._push(first_at, _FIRST, (out, out.token))

    def preempt(self, decision: Preempt, now: float) -> None:
        out = self._outcomes[decision.request_id]
        costs = self.costs
        req = out.req
        if self.engines is not None and now < out.spec.arrival_s + out.ttft_s:
            self._stopped_in_prefill(out, now)
            save = costs.step_s
        else:
            progress = max(0.0, now - out.run_start_s - out.overhead_s)
            if out.remaining_s - progress <= costs.step_s:
                return  # it ends within a decode step: the finish event stands
            out.remaining_s -= progress
            out.tokens_done += costs.generated_in(progress)
            held = costs.tokens_held(req.prompt_tokens, out.tokens_done)
            save = costs.save_s(held) if decision.mode is StopMode.CHECKPOINT else costs.step_s
        if self.gpu is not None:
            self.timeline.append(("preempt", out.gpus, now, req.model, req.priority))
        out.token += 1
        self._push(now + save, _STOPPED, (out, out.token))

    def _stopped_in_prefill(self, out: Outcome, now: float) -> None:
        """``out`` is stopped before its first token: its engine drops the prefill it had not
        done (those queued behind it there get their first token sooner), and it starts
        again from its prompt, prefilled where it runs next."""
        assert self.engines is not None
        for rid, sooner in self.engines.give_back(out.worker, out.req.id, now).items():
            other = self._outcomes[rid]
            other.remaining_s -= sooner
            other.ttft_s -= sooner
            other.token += 1
            ends = other.run_start_s + other.overhead_s + other.remaining_s
            self._push(ends, _FINISH, (other, other.token))
            if not other.req.prefilled:
                self._push(max(now, other.spec.arrival_s + other.ttft_s), _FIRST, (other, other.token))
        out.remaining_s = service_time(out.spec, self.costs)
        out.ttft_s = math.nan
        out.cached_tokens = 0


def simulate(
    requests: Sequence[SimRequest],
    *,
    slots: int,
    policy: str = "laneway",
    config: SchedulerConfig | None = None,
    scenario: str = "trace",
    seed: int | None = None,
    check: bool = False,
    inventory: Inventory | None = None,
    workers: Sequence[WorkerSpec] | None = None,
    caches: bool = False,
) -> SimResult:
    return Simulation(
        requests,
        slots=slots,
        policy=policy,
        config=config,
        scenario=scenario,
        seed=seed,
        check=check,
        inventory=inventory,
        workers=workers,
        caches=caches,
    ).run()
