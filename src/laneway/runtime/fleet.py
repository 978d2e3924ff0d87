"""A live GPU fleet: the core's ``Load`` and ``Evict`` decisions carried out with engine processes.

The core places models on GPUs (:class:`~laneway.core.gpu_placement.GpuPlacement`, the
simulator's placement); this part acts:

- ``Load``: the model's engine is started on the chosen GPUs
  (:class:`~laneway.runtime.launcher.EngineProcess`); once ready it becomes an upstream
  worker named by the replica's id, serving the model, and the core is told
  (``loaded``), with the load time measured (``load_took``: later decisions use it);
- ``Evict``: the replica's worker leaves and its engine is stopped, or put to sleep
  (``Evict(sleep=True)``, :mod:`laneway.runtime.engine_sleep`) and later woken where it
  was (``Load(wake=True)``); a new engine starts on GPUs only once what was stopped or put
  to sleep there is done (its memory free);
- models in ``preload`` are started with the server, which is ready once they are;
- a launch that fails is logged with the end of its engine's log, the core frees its
  GPUs (``unloaded``), the model's queued requests get 503 ``model_unavailable``
  naming the reason, and new ones get it at once for a back-off (5 s, doubling to
  5 minutes while launches keep failing); after it the next request tries again, and
  a preloaded model is tried again by itself (``Scheduler.reload``);
- an engine that exits by itself is taken out at once: its requests fail over as any
  upstream's do (run elsewhere, or queued again and a new replica loaded), its GPUs are
  freed, and a preloaded model's engine is started again;
- ``LoadAdapter`` / ``UnloadAdapter``: LoRA adapters loaded into running engines
  (:mod:`laneway.runtime.fleet_adapters`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from laneway.backends.base import Worker
from laneway.backends.factory import build_upstream
from laneway.backends.upstream import UpstreamWorker
from laneway.config.fleet import FleetConfig
from laneway.config.schema import ServerConfig, WorkerConfig
from laneway.core import Evict, Load, Scheduler
from laneway.core.gpu_placement import GpuPlacement
from laneway.core.policies import policy as policy_spec
from laneway.generation import CHAT, COMPLETION, EMBEDDING
from laneway.protocol.requests import Support
from laneway.runtime import engine_adapters, engine_sleep
from laneway.runtime.fleet_adapters import FleetAdapters
from laneway.runtime.fleet_faults import BROKEN_RUNS, Faults
from laneway.runtime.launcher import EngineProcess, LaunchFailed, kill_engines
from laneway.runtime.placing import EngineInfo, LocalPlacing, Placing, Started
from laneway.runtime.ticket import Phase

if TYPE_CHECKING:
    from laneway.runtime.runtime import Runtime

log = logging.getLogger("laneway.fleet")

DRAIN_POLL_S = 0.1
DRAIN_POLLS = 300  # (an engine that died: its requests are ended or moved within 30 s)


class Fleet:
    def __init__(
        self, runtime: Runtime, core: Scheduler, config: FleetConfig, planner: GpuPlacement, data_dir: Path
    ) -> None:
        self.rt = runtime
        self.core = core
        self.cfg = config
        self.planner = planner
        self.log_dir = data_dir / "engines"
        self.engines: dict[str, EngineProcess] = {}  # replica id -> its engine (starting or ready)
        self.sleeping: dict[str, EngineProcess] = {}  # replica id -> its engine, asleep
        # models failing to start (backing off), engines whose runs fail
        self.faults = Faults(runtime, lambda name: name in config.inventory.models)
        self.load_times: dict[str, list[float]] = {}  # model -> seconds each launch took to be ready
        self._watches: set[asyncio.Task[None]] = set()
        # engines being stopped, by GPU: a new engine starts on a GPU once the old one is gone
        # (its memory is free only then)
        self._stopping: dict[str, set[asyncio.Task[None]]] = {}
        self._falling_asleep: dict[str, bool] = {}  # replica -> whether it is to stop once asleep
        # where its loads were decided: this process's core, or (set by a cluster's node) the leader
        self.placing: Placing = LocalPlacing(runtime, core, planner)
        self.node: str | None = None  # (in a cluster: the node whose GPUs this replica starts engines on)
        # (in a cluster: where the leader placed what, as it publishes it: fleet_view.placed)
        self.cluster_view: dict[str, Any] | None = None
        self.adapters = FleetAdapters(self)

    @classmethod
    def of(cls, runtime: Runtime, config: ServerConfig) -> Fleet:
        """The fleet of ``config`` (its ``[fleet]``), with the core that places its models."""
        fleet = config.fleet
        assert fleet is not None
        planner = GpuPlacement(
            fleet.inventory,
            naive=policy_spec(config.policy).placement == "naive",
            switch_wait_s=fleet.switch_wait_s,
        )
        core = Scheduler([], config.scheduler, config.policy, placement=planner)
        return cls(runtime, core, fleet, planner, config.data_dir)

    def support(self) -> dict[str, Support]:
        """What serves each model: an upstream's engine, passed through."""
        kinds = frozenset({CHAT, COMPLETION, EMBEDDING})
        return {m: Support(True, kinds=kinds) for m in self.cfg.inventory.models}

    # ------------------------------------------------------------ start and stop
    async def start(self) -> None:
        """Start the preloaded replicas (the core has them ready already: out of placement
        until their engines are) and wait for them."""
        replicas = self.planner.replicas
        preloads = [rid for rid, r in replicas.items() if r.ready and self._mine(r.gpus)]
        for rid in preloads:
            self.placing.hold(rid)
        results = await asyncio.gather(
            *(
                self._launch(rid, replicas[rid].model.name, replicas[rid].gpus, preload=True)
                for rid in preloads
            )
        )
        ready = sum(results)
        if preloads:
            log.info("%d of %d preloaded engines ready", ready, len(preloads))

    async def close(self) -> None:
        """Stop every engine (each gets its stop grace)."""
        engines = [*self.engines.values(), *self.sleeping.values()]
        self.engines.clear()
        self.sleeping.clear()
        for task in self._watches:
            task.cancel()
        stopping = set().union(*self._stopping.values())
        await asyncio.gather(*(e.stop() for e in engines), *self._watches, *stopping, return_exceptions=True)

    def kill(self) -> int:
        """The exit forced: every engine started (stopping or not) killed now; how many."""
        return kill_engines()

    # ------------------------------------------------------------ decisions
    def load(self, d: Load, now: float) -> None:
        if d.wake:
            self.rt.metrics.model_wakes.labels(d.model).inc()
            self.rt.spawn(self._wake(d))
            return
        if self.node is not None and self.faults.refusal(d.model) is not None:
            # (a cluster's leader decided it before it heard the model fails: not tried again yet)
            self.placing.gone(d.replica_id, d.model)
            return
        self.rt.metrics.model_loads.labels(d.model).inc()
        self.rt.spawn(self._load(d))

    async def _load(self, d: Load) -> None:
        await self._launch(d.replica_id, d.model, d.gpu_ids, preload=False)

    def _mine(self, gpus: tuple[str, ...]) -> bool:
        """Whether this server starts the engines of ``gpus`` (a cluster's replica: of its node)."""
        gpu = self.planner.vram.gpus.get(gpus[0]) if gpus else None
        return self.node is None or (gpu is not None and gpu.node == self.node)

    def evict(self, d: Evict, now: float) -> None:
        rid = d.replica_id
        engine = self.sleeping.pop(rid, None)  # (one asleep: its engine stops)
        if engine is None:
            log.info("%s %s", "putting to sleep" if d.sleep else "evicting", rid)
            self.rt.spawn(self.remove_worker(rid))
            engine = self.engines.pop(rid, None)
        if engine is None:
            if rid in self._falling_asleep:  # (told to stop it while it falls asleep)
                self._falling_asleep[rid] = True
            return
        self.placing.evicted(rid)
        if d.sleep:
            self._falling_asleep[rid] = False
        self._stopping_on(d.gpu_ids, self._sleep(rid, engine) if d.sleep else engine.stop())

    def _stopping_on(self, gpus: tuple[str, ...], stop: Coroutine[Any, Any, None]) -> None:
        """An engine on ``gpus`` is being stopped (or put to sleep) by ``stop``: what starts on
        them next waits for it (their memory is free only then)."""
        task = asyncio.get_running_loop().create_task(stop)
        for gid in gpus:
            held = self._stopping.setdefault(gid, set())
            held.add(task)
            task.add_done_callback(held.discard)

    async def _after_stops(self, gpus: tuple[str, ...]) -> None:
        """Until the engines being stopped or put to sleep on ``gpus`` have freed them."""
        before = set().union(*(self._stopping.get(g, set()) for g in gpus))
        if before:
            await asyncio.gather(*before, return_exceptions=True)

    async def _sleep(self, rid: str, engine: EngineProcess) -> None:
        try:
            await engine_sleep.sleep(engine)
        except engine_sleep.SleepFailed as exc:
            self._falling_asleep.pop(rid, None)
            log.warning("%s could not sleep (%s): its engine is stopped instead", rid, exc)
            await engine.stop()
            self.placing.slept_away(rid, engine.model)
            return
        stop = self._falling_asleep.pop(rid, True)
        if not stop and not self.rt.closed:
            self.sleeping[rid] = engine
        else:  # (told to stop it while it fell asleep)
            await engine.stop()

    async def _wake(self, d: Load) -> None:
        rid, rt = d.replica_id, self.rt
        await self._after_stops(d.gpu_ids)  # (its own fall asleep included)
        if rt.closed:
            return
        engine = self.sleeping.pop(rid, None)
        t0 = time.monotonic()
        try:
            if engine is None:
                raise engine_sleep.SleepFailed("its engine is gone")
            self.engines[rid] = engine
            await engine_sleep.wake(engine)
        except engine_sleep.SleepFailed as exc:
            log.warning("%s could not be woken (%s): it will be started afresh", rid, exc)
            self.engines.pop(rid, None)
            if engine is not None:
                await engine.stop()
            self.placing.gone(rid, d.model)
            rt.kick()
            return
        took = time.monotonic() - t0
        log.info("%s awake in %.2f s", rid, took)
        await self._join(rid, d.model, d.gpu_ids, engine, took, preload=False, wake=True)

    async def _launch(self, rid: str, model: str, gpus: tuple[str, ...], *, preload: bool) -> bool:
        rt = self.rt
        launch = self.cfg.launch[model]
        cuda = tuple(self.cfg.cuda[g] for g in gpus)
        engine = EngineProcess(rid, model, launch, cuda, self.log_dir, gpus)
        self.engines[rid] = engine
        await self._after_stops(gpus)  # (the engines evicted for it still free their memory)
        if rt.closed or self.engines.get(rid) is not engine:  # (laneway stops meanwhile)
            return False
        try:
            await engine.start()
        except LaunchFailed as exc:
            self.engines.pop(rid, None)
            if not rt.closed:
                self._failed(rid, model, str(exc))
            return False
        if rt.closed or self.engines.get(rid) is not engine:  # (stopped meanwhile)
            await engine.stop()
            return False
        log.info("%s ready in %.1f s on %s", rid, engine.ready_s, engine.url)
        if not await self._join(rid, model, gpus, engine, engine.ready_s, preload=preload):
            return False
        self.faults.started(model)
        self.load_times.setdefault(model, []).append(engine.ready_s)
        rt.metrics.model_load.labels(model).observe(engine.ready_s)
        watch = asyncio.get_running_loop().create_task(self._watch(rid, engine))
        self._watches.add(watch)
        watch.add_done_callback(self._watches.discard)
        return True

    async def _join(
        self,
        rid: str,
        model: str,
        gpus: tuple[str, ...],
        engine: EngineProcess,
        took_s: float,
        *,
        preload: bool,
        wake: bool = False,
    ) -> bool:
        """A started (or woken) engine becomes the replica's worker, once it serves its model."""
        rt = self.rt
        launch = self.cfg.launch[model]
        served = launch.engine_model or model
        adapters = self.cfg.inventory.adapters.get(model, ())
        info = EngineInfo(
            engine.url,
            served,
            self.cfg.inventory.models[model].slots,
            tuple(self.adapters.names[a] for a in adapters),
        )
        worker = self.worker_of(rid, model, info)
        health = await worker.health()  # (up, but is it what laneway will send requests to?)
        if not health.ok:
            await worker.close()
            await engine.stop()
            self.engines.pop(rid, None)
            hint = "" if launch.engine_model else " (the name it serves the model under: engine_model)"
            self._failed(rid, model, f"its engine is up but {health.detail}{hint}")
            return False
        if adapters and isinstance(worker, UpstreamWorker):  # (its requests may name its adapters)
            worker.gate = self.adapters.gate(rid)
        self.add_worker(rid, worker, model, served)
        await self.placing.ready(Started(rid, model, gpus, info, took_s, preload, wake))
        await rt.prober.add(rid)
        rt.kick()
        return True

    @staticmethod
    def worker_of(rid: str, model: str, info: EngineInfo, *, elsewhere: bool = False) -> Worker:
        """The upstream worker that sends replica ``rid``'s requests to its engine (one another
        replica of a cluster started: ``elsewhere``)."""
        worker = build_upstream(
            WorkerConfig(
                name=rid,
                type="upstream",
                model=info.served,
                served_name=model,
                slots=info.slots,
                url=info.url,
            )
        )
        if info.adapters and isinstance(worker, UpstreamWorker):  # (its requests may name its adapters)
            worker.adapters = frozenset(info.adapters)
            if elsewhere:  # (its owner loads them: a request is sent once the engine has it)
                worker.gate = engine_adapters.listed_gate(info.url, worker.adapters)
        return worker

    # ------------------------------------------------------------ failures
    def _failed(self, rid: str, model: str, reason: str) -> None:
        rt = self.rt
        rt.metrics.load_failures.labels(model).inc()
        self.placing.gone(rid, model)
        backoff = self.back_off(model, f"{rid} could not be started", reason)
        self._preload_again(model, backoff)
        rt.kick()

    def back_off(self, model: str, what: str, reason: str, *, stopped: bool = False) -> float:
        """``model`` failed to load (or its engines were ``stopped`` as broken): it backs off
        (:meth:`Faults.back_off`), and where it was placed is told."""
        backoff = self.faults.back_off(model, what, reason, stopped=stopped)
        self.placing.failed(model, reason, backoff)
        return backoff

    def _preload_again(self, model: str, after_s: float) -> None:
        """A preloaded model lost its replica: start one again after ``after_s`` (the core
        places it in free VRAM; if none is free then, it comes with the next request)."""
        if model not in self.cfg.inventory.preload or self.rt.closed:
            return

        def again() -> None:
            if not self.rt.closed:
                self.placing.reload(model)

        self.rt.loop.call_later(after_s, again)

    async def _watch(self, rid: str, engine: EngineProcess) -> None:
        status = await engine.wait()
        if engine.stopping or self.rt.closed:
            return
        if self.sleeping.get(rid) is engine:  # it died asleep: a later request starts it afresh
            del self.sleeping[rid]
            log.error("the engine of %s exited asleep with status %s", rid, status)
            self.placing.slept_away(rid, engine.model)
            return
        if self.engines.get(rid) is not engine:
            return
        self.engines.pop(rid, None)
        log.error("the engine of %s exited with status %s%s", rid, status, engine.tail())
        await self._gone(rid, engine.model, f"its engine exited with status {status}")
        self._preload_again(engine.model, 0.0)
        self.rt.kick()

    async def _gone(self, rid: str, model: str, reason: str) -> None:
        """Replica ``rid``'s engine is gone (or going): out of placement, its requests failed
        over, its worker removed, its GPUs free in the core."""
        self.rt.prober.take_out(rid, reason)
        for _ in range(DRAIN_POLLS):  # (its requests fail over as any upstream's: elsewhere, or queued)
            if not self.runs_on(rid):
                break
            await asyncio.sleep(DRAIN_POLL_S)
        else:
            log.error("%s still runs requests %g s after its engine went", rid, DRAIN_POLLS * DRAIN_POLL_S)
        await self.remove_worker(rid)
        self.placing.gone(rid, model)

    def _take_down(self, rid: str, engine: EngineProcess, why: str) -> None:
        """Replica ``rid``'s ``engine`` (out of :attr:`engines`) is stopped, killed past its
        grace, and gone as one that exited (:meth:`_gone`)."""
        self._stopping_on(engine.gpu_ids, engine.stop())
        self.rt.spawn(self._gone(rid, engine.model, why))

    def owns(self, rid: str) -> bool:
        """Whether replica ``rid``'s engine is one this process started (and runs now)."""
        return rid in self.engines

    def run_failed(self, rid: str, request_id: str, reason: str) -> bool:
        """Request ``request_id`` failed on replica ``rid`` by its engine's fault (answered
        wrongly, its stream broken). Such a replica stays in placement (its probe says
        whether it is up; were it taken out, another replica would be started for each
        failure): the request is tried again there, and when
        :data:`~laneway.runtime.fleet_faults.BROKEN_RUNS` requests in a row fail so on the
        model's engines, none ending well between, they are broken, not busy: those at
        fault are stopped and the model backs off for a while. Whether this failure made
        them so (the request is not tried again then)."""
        engine = self.engines.get(rid)
        if engine is None or self.rt.closed:
            return False
        model = engine.model
        at_fault = self.faults.run_failed(model, rid, request_id)
        if at_fault is None:
            return False
        why = f"its engines were stopped after failing {BROKEN_RUNS} requests in a row: {reason}"
        log.error("stopping the engines of %s (%s): %s", model, ", ".join(sorted(at_fault)), why)
        for r in sorted(at_fault):
            broken = self.engines.pop(r, None)
            if broken is not None:
                self._take_down(r, broken, why)
        self.rt.metrics.load_failures.labels(model).inc()
        backoff = self.back_off(model, f"the engines of {model} were stopped", why, stopped=True)
        self._preload_again(model, backoff)
        self.rt.kick()
        return True

    def hung(self, rid: str, reason: str) -> None:
        """Replica ``rid``'s engine lives but answers nothing (its probes fail): it is
        stopped (killed past its grace) and gone as an engine that exited is — its requests
        fail over, its GPUs are free for another replica of its model, a preloaded model is
        started again."""
        engine = self.engines.pop(rid, None)
        if engine is None or self.rt.closed:
            return
        log.error("stopping the engine of %s: %s", rid, reason)
        self._take_down(rid, engine, f"its engine was stopped: {reason}")
        self._preload_again(engine.model, 0.0)
        self.rt.kick()

    def ran(self, rid: str | None) -> None:
        """A request on ``rid`` ended well: its model's engines are not broken."""
        engine = self.engines.get(rid) if rid is not None else None
        if engine is not None:
            self.faults.ran(engine.model)

    # ------------------------------------------------------------ the runtime's workers
    def add_worker(self, name: str, worker: Worker, model: str, engine_model: str) -> None:
        """``worker`` (an engine, ready) serves ``model`` from now on, as ``name``."""
        rt = self.rt
        rt.workers[name] = worker
        rt.tracing.carried_by(worker)
        rt.served[name] = model
        rt.upstream_model[name] = engine_model
        rt.engines.kv_tokens.setdefault(name, None)

    async def remove_worker(self, name: str) -> None:
        """Worker ``name`` leaves (its replica was evicted, or its engine died and what it
        ran has failed over)."""
        rt = self.rt
        self.adapters.forget(name)
        worker = rt.workers.pop(name, None)  # (at once: a dispatch to it meanwhile makes it anew)
        if worker is None:
            return
        rt.prober.remove(name)
        rt.metrics.forget_worker(name)
        rt.served.pop(name, None)
        rt.upstream_model.pop(name, None)
        rt.engines.kv_tokens.pop(name, None)
        try:
            await worker.close()
        except Exception:
            log.exception("closing worker %s failed", name)

    def runs_on(self, name: str) -> bool:
        """Whether some request runs (or is being stopped) on worker ``name``."""
        busy = (Phase.RUNNING, Phase.STOPPING)
        return any(t.worker == name and t.phase in busy for t in self.rt.tickets.values())
