"""Preemption: who stops for whom, when drains turn into preemptions, and
time-slice demotion (multi-level feedback).

A mixin of :class:`~laneway.core.scheduler.Scheduler`: these methods read and
change the scheduler's state; victim choice itself is the pure functions of
:mod:`laneway.core.preemption`.
"""

from __future__ import annotations

import heapq
import math

from laneway.core.decisions import Decision, Preempt
from laneway.core.errors import InvalidTransition
from laneway.core.preemption import Candidate, choose_action, gather_candidates, may_stop_again
from laneway.core.request import Request, State, transition
from laneway.core.selection import NONE_BLOCKED

_RUNNING = State.RUNNING
_PREEMPTED = State.PREEMPTED
_QUEUED = State.QUEUED
OVERRUN = 1.0  # a time slice preempts a hinted request once it runs past hint x this


class Preempting:
    __slots__ = ()  # the scheduler's attributes are slots (see Scheduler)

    def preempted(
        self,
        request_id: str,
        now: float,
        *,
        tokens_done: int | None = None,
        checkpoint_bytes: int | None = None,
        save_s: float | None = None,
    ) -> None:
        """The worker stopped a preempted request and its slot is free.

        A worker that measures its checkpoint (``checkpoint_bytes``, and
        ``save_s`` the time the copy took) teaches the cost model used to
        choose victims and preemption modes.
        """
        req = self.get(request_id)
        if req.state is not _PREEMPTED:
            raise InvalidTransition(f"request {request_id} is {req.state.value}, not preempted")
        ran = max(req.preempt_at_s - req.started_s, 0.0)
        req.run_s += ran
        costs = self.costs
        req.tokens_done = (
            tokens_done if tokens_done is not None else req.tokens_done + costs.generated_in(ran)
        )
        held = costs.tokens_held(req.prompt_tokens, req.tokens_done)
        if checkpoint_bytes is None:
            checkpoint_bytes = costs.checkpoint_bytes(held) if req.resume == "checkpoint" else 0
        elif checkpoint_bytes > 0 and req.prompt_tokens:
            self.costs = costs.observed(checkpoint_bytes, held, save_s)
        req.checkpoint_bytes = checkpoint_bytes
        self._release(req)
        req.state = _QUEUED  # PREEMPTED -> QUEUED, checked above
        req.enqueued_s = now
        self.lanes.push(req)
        if req.tenant is not None:
            self.admission.on_requeue(req.tenant)

    def _preemptible(self, req: Request, now: float) -> bool:
        cfg = self.cfg
        return (
            req.state is _RUNNING
            and req.claimed_for is None
            and req.preemptible
            and self.classes[req.cls].preemptible
            and may_stop_again(req, now, cfg.max_preempt_loss, cfg.max_preemptions)
        )

    def _candidates(
        self, victims: tuple[int, ...], model: str | None, now: float, cls: int | None = None
    ) -> list[Candidate]:
        cfg = self.cfg
        return gather_candidates(
            self._running,
            victims,
            self.workers,
            model,
            now,
            self.costs,
            cfg.max_preempt_loss,
            cfg.max_preemptions,
            cls,
        )

    def _preempt(self, now: float, out: list[Decision]) -> None:
        count = self.lanes.class_count
        running = self._running
        incoming = self._incoming
        reserved = self._reserved
        for c in self._rights:
            need = count[c] - incoming[c] - reserved[c]
            if need <= 0:
                continue
            for v in self._victims[c]:
                if running[v]:
                    break
            else:
                continue  # nothing it may preempt is running
            if self._barren[c] == self._changes:
                continue  # searched in vain and no slot changed hands since
            mode = self.pol.preemption
            cap = self.cfg.drain_cap_s
            model = None
            head: Request | None = None
            if len(self.lanes.models) > 1:  # requests name models: victims must serve it
                head = self._best_in_class(c, now, NONE_BLOCKED)
                model = head.model if head is not None else None
            while need > 0:
                action = choose_action(self._candidates(self._victims[c], model, now, c), mode, cap)
                if action is None:
                    if self._planner is not None and self._room_for(c, now, out):
                        need -= 1
                        continue
                    self._barren[c] = self._changes
                    break
                victim = self._reqs[action.victim.request_id]
                victim.claimed_for = c
                self._incoming[c] += 1
                if action.kind == "drain":
                    wait = cap if mode == "drain" else action.victim.eta_s + action.victim.lost_s
                    # stop draining in time for the waiting request to start before it expires
                    if head is None:
                        head = self._best_in_class(c, now, NONE_BLOCKED)
                    latest = head.deadline_s - action.victim.lost_s if head is not None else math.inf
                    victim.claim_deadline_s = max(now, min(now + wait, latest))
                    self._drains[victim.id] = victim
                    self.counters.drains += 1
                else:
                    self._stop(victim, action.mode, c, now, out)
                need -= 1

    def _lapsed_clearings(self, now: float) -> None:
        """A graceful clearing whose window passed: search again (and preempt).

        The lapsed window leaves a mark, ``(-inf, True)``, so that the search of
        this call preempts at once; a mark no search used (the request was
        served otherwise) is dropped at the next call, and a later need opens
        a new window."""
        for model, (until, drained) in list(self._clearing.items()):
            if until <= now:
                if drained and until != -math.inf:
                    self._clearing[model] = (-math.inf, True)  # ended draining: preempt now
                    self._changes += 1
                else:  # a mark left unused, or a stopping window over
                    del self._clearing[model]

    def _room_for(self, c: int, now: float, out: list[Decision]) -> bool:
        """GPU fleets: the head of class ``c`` fits nowhere and nothing it may
        preempt runs its model: clear replicas of other models to load it."""
        assert self._planner is not None
        head = self._best_in_class(c, now, NONE_BLOCKED)
        if head is None or head.model is None:
            return False
        until, drained = self._clearing.get(head.model, (0.0, False))
        if until > now:
            return False  # clearing for it already
        victims_of = self._victims[c]
        victims = self._planner.make_room(
            head, now, lambda r: r.cls in victims_of and self._preemptible(r, now)
        )
        if victims is None:
            return False
        load_s = self._planner.inv.models[head.model].load_s
        if self.pol.preemption == "drain" and not drained:
            # graceful: let the victims end if they do so within the drain cap and
            # in time for the load to finish before the request's queue timeout
            window = min(self.cfg.drain_cap_s, head.deadline_s - now - load_s - 1.0)
            if window > 0 and all(
                max(v.est_s - v.run_s - (now - v.started_s), 0.0) <= window for v in victims
            ):
                self._clearing[head.model] = (now + window, True)
                return True
        self._clearing[head.model] = (now + self._planner.switch_wait_s, False)
        for v in victims:
            self._stop(v, self._cheapest_mode(v, now), c, now, out)
        return True

    def _stop(self, victim: Request, mode: str, for_class: int, now: float, out: list[Decision]) -> None:
        transition(victim, _PREEMPTED)
        victim.preempt_at_s = now
        victim.preemptions += 1
        checkpoint_s, recompute_s = self.costs.round_trips(
            victim.prompt_tokens, victim.tokens_done, now - victim.started_s
        )
        victim.lost_s += checkpoint_s if mode == "checkpoint" else recompute_s
        victim.resume = mode
        self._drains.pop(victim.id, None)
        self.counters.preemptions[victim.cls] += 1
        out.append(Preempt(victim.id, victim.worker, mode, for_class))  # type: ignore[arg-type]

    def _cheapest_mode(self, req: Request, now: float) -> str:
        costs = self.costs
        held = costs.tokens_held(req.prompt_tokens, req.tokens_done + costs.generated_in(now - req.started_s))
        can = self.workers[req.worker].spec.can_checkpoint  # type: ignore[index]
        if self.pol.preemption == "recompute" or not can:
            return "recompute"
        if self.pol.preemption == "checkpoint":
            return "checkpoint"
        return "checkpoint" if costs.checkpoint_cost_s(held) <= costs.recompute_cost_s(held) else "recompute"

    def _overran(self, req: Request, now: float) -> bool:
        """Time slices preempt work the scheduler knew nothing about, or work that
        ran well past its size hint; a request whose hint placed it at its level
        in the first place is left to finish."""
        hint = req.est_service_s
        return hint is None or req.run_s + (now - req.started_s) > OVERRUN * hint

    def _overdue_drains(self, now: float, out: list[Decision]) -> None:
        """A drained victim that has not ended by its deadline is preempted, if
        its claimant class still needs the slot; otherwise the claim lapses."""
        count = self.lanes.class_count
        for req in [r for r in self._drains.values() if r.claim_deadline_s <= now]:
            c: int = req.claimed_for  # type: ignore[assignment]
            if count[c] - self._incoming[c] - self._reserved[c] < 0:
                req.claimed_for = None
                self._incoming[c] -= 1
                del self._drains[req.id]
                self._changes += 1  # it may be a victim for someone else now
                continue
            self._stop(req, self._cheapest_mode(req, now), c, now, out)

    def _start_level(self, est_s: float) -> int:
        """Multi-level feedback with a size hint: a request expected to run long
        starts at the level it would reach anyway (level ``l`` holds work up to
        ``slice x (2^(l+1) - 1)`` seconds of service)."""
        top = self.lanes.levels - 1
        level = 0
        while level < top and est_s > self.cfg.mlfq_slice_s * (2 ** (level + 1) - 1):
            level += 1
        return level

    def _feedback(self, now: float, out: list[Decision]) -> None:
        """Multi-level feedback: a request past its time slice drops a level and
        yields its slot if shorter work of its class is waiting."""
        heap = self._slices
        lanes = self.lanes
        top = lanes.levels - 1
        while heap and heap[0][0] <= now:
            _, _, started, req = heapq.heappop(heap)
            if req.state is not _RUNNING or req.started_s != started:
                continue
            if req.level < top:
                req.level += 1
            waiting = lanes.waiting_below(req.cls, req.level)
            if waiting and self._free == 0 and self._overran(req, now) and self._preemptible(req, now):
                req.claimed_for = req.cls
                self._incoming[req.cls] += 1
                self._stop(req, self._cheapest_mode(req, now), req.cls, now, out)
            else:
                slice_s = self.cfg.mlfq_slice_s * (2**req.level)
                heapq.heappush(heap, (now + slice_s, req.seq, started, req))
