"""Victim choice and preemption mode: small pure functions over candidates.

The preemption step (:mod:`laneway.core.preemption`) gathers :class:`Candidate` rows for
running requests that the waiting class may preempt; :func:`choose_victim` and
:func:`choose_action` decide, and :func:`preempt_mode` is the one rule for checkpoint or
recompute. Nothing here looks at queues.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal, NamedTuple

from laneway.core.costs import CostModel
from laneway.core.modes import PreemptionMode, StopMode
from laneway.core.request import Request, State
from laneway.core.workers import WorkerState

_RUNNING = State.RUNNING
MAX_SCAN = 8  # running requests examined per victim class, from each end
PER_END = 1  # candidates taken from each end


def may_stop_again(r: Request, now: float, max_loss: float | None, max_count: int | None) -> bool:
    """Whether running request ``r`` may be preempted (again) now, by the bound on what
    preemptions cost it: at most ``max_loss`` of its expected service lost to them so far
    (``None``: no bound), and at most ``max_count`` of them (``None``: no cap)."""
    n = r.preemptions
    if max_count is not None and n >= max_count:
        return False
    # (its expected service, not the time it ran: whether it may be preempted changes only
    # when it is preempted or its size is revised, which the victim search keeps track of)
    return n == 0 or max_loss is None or r.lost_s <= max_loss * r.est_s


_CHECKPOINT, _RECOMPUTE = StopMode.CHECKPOINT, StopMode.RECOMPUTE


def preempt_mode(
    policy_mode: PreemptionMode, can_checkpoint: bool, checkpoint_s: float, recompute_s: float
) -> StopMode:
    """How to stop a victim: ``recompute`` under that policy or where its worker cannot
    checkpoint, ``checkpoint`` under that policy, else the cheaper round trip
    (``checkpoint_s`` save + restore against ``recompute_s`` re-prefill)."""
    if policy_mode == PreemptionMode.RECOMPUTE or not can_checkpoint:
        return _RECOMPUTE
    if policy_mode == PreemptionMode.CHECKPOINT:
        return _CHECKPOINT
    return _CHECKPOINT if checkpoint_s <= recompute_s else _RECOMPUTE


class Candidate(NamedTuple):
    request_id: str
    worker_id: str
    cls: int  # the victim's class rank (larger = less urgent)
    seq: int
    eta_s: float  # expected remaining service
    checkpoint_s: float  # slot time of a checkpoint round trip (save + restore)
    recompute_s: float  # slot time of a recompute round trip (re-prefill)
    can_checkpoint: bool = True
    lost_before_s: float = 0.0  # what its earlier preemptions cost it

    @property
    def best_mode(self) -> StopMode:
        return preempt_mode(PreemptionMode.AUTO, self.can_checkpoint, self.checkpoint_s, self.recompute_s)

    @property
    def lost_s(self) -> float:
        """Slot time wasted by preempting it the cheapest way available (that of
        :attr:`best_mode`: the cheaper round trip, where it may checkpoint)."""
        return min(self.checkpoint_s, self.recompute_s) if self.can_checkpoint else self.recompute_s


class Action(NamedTuple):
    kind: str  # "preempt" or "drain"
    victim: Candidate
    mode: StopMode | Literal["drain"]  # how to stop it (a preemption), or "drain"


def eta_of(r: Request, now: float) -> float:
    """How long running ``r`` is reckoned to need yet, for drains: its expected service
    left, but never under a quarter of its expected service (one past its expected end
    is not taken to end at once)."""
    return max(r.est_s - r.run_s - (now - r.started_s), 0.25 * r.est_s)


def _victim_key(c: Candidate) -> tuple[int, float, int]:
    # what it would lose now plus what it lost before: preemptions spread over the
    # victims rather than hitting again and again the one resumed last
    return (-c.cls, c.lost_s + c.lost_before_s, -c.seq)


def _soonest_key(c: Candidate) -> tuple[float, int, int]:
    return (c.eta_s, -c.cls, -c.seq)


def choose_victim(cands: Sequence[Candidate]) -> Candidate | None:
    """Lowest class first, then least work lost (now and by earlier preemptions), then
    the latest arrival (seq)."""
    if not cands:
        return None
    return min(cands, key=_victim_key)


def soonest(cands: Sequence[Candidate]) -> Candidate | None:
    if not cands:
        return None
    return min(cands, key=_soonest_key)


def on_worker(cands: Sequence[Candidate], worker: str | None) -> Sequence[Candidate]:
    """The candidates of the class a victim is chosen from (the lowest) that run on
    ``worker`` — where the waiting request's prompt is cached, so that the slot it frees
    is there — or all of ``cands`` if none does (or ``worker`` is ``None``)."""
    if worker is None or not cands:
        return cands
    low = max(c.cls for c in cands)
    mine = [c for c in cands if c.worker_id == worker and c.cls == low]
    return mine or cands


def choose_action(cands: Sequence[Candidate], mode: PreemptionMode, drain_cap_s: float) -> Action | None:
    """Decide how to free one slot for a waiting request.

    - ``drain``: wait for the soonest-finishing victim when its ETA is under
      ``drain_cap_s``; else preempt the chosen victim the cheapest way.
    - ``auto``: drain when a victim will finish sooner than preempting the
      chosen victim would cost, else preempt it the cheapest way.
    - ``checkpoint`` / ``recompute``: always preempt in that mode
      (``checkpoint`` falls back to recompute where a worker cannot checkpoint).
    """
    victim = choose_victim(cands)
    if victim is None:
        return None
    first = soonest(cands)
    assert first is not None
    if mode == PreemptionMode.DRAIN:
        if first.eta_s <= drain_cap_s:
            return Action("drain", first, "drain")
        return Action("preempt", victim, victim.best_mode)
    if mode == PreemptionMode.AUTO:
        if first.eta_s <= victim.lost_s:
            return Action("drain", first, "drain")
        return Action("preempt", victim, victim.best_mode)
    if mode in (PreemptionMode.CHECKPOINT, PreemptionMode.RECOMPUTE):
        return Action(
            "preempt",
            victim,
            preempt_mode(mode, victim.can_checkpoint, victim.checkpoint_s, victim.recompute_s),
        )
    raise ValueError(f"unknown preemption mode {mode!r}")


def gather_candidates(
    running: Sequence[dict[str, Request]],
    victims: Sequence[int],
    workers: Mapping[str, WorkerState],
    model: str | None,
    now: float,
    costs: CostModel,
    max_loss: float | None,
    max_count: int | None,
    for_class: int | None = None,
    helps: Callable[[Request, str], bool] | None = None,
) -> list[Candidate]:
    """Running requests of the ``victims`` classes that may be preempted.

    ``running[c]`` holds class ``c``'s running requests in start order. A
    class with up to ``2 x MAX_SCAN`` running is looked at whole; a larger one
    gives the few started last (least progress to lose) and the few started
    first (soonest to finish, for drains), looking at no more than
    ``MAX_SCAN`` from each end, so victim choice stays O(1) however many run.
    """
    out: list[Candidate] = []
    for v in sorted(victims, reverse=True):
        group = running[v]
        if not group:
            continue
        seen: set[str] = set()
        small = len(group) <= 2 * MAX_SCAN  # few enough to look at every one
        ends = (group.values(),) if small else (reversed(group.values()), iter(group.values()))
        for it in ends:
            taken = scanned = 0
            for r in it:
                scanned += 1
                if not small and (taken >= PER_END or scanned > MAX_SCAN):
                    break
                if (
                    r.state is not _RUNNING
                    or r.claimed_for is not None
                    or not r.preemptible
                    or r.id in seen
                    or not may_stop_again(r, now, max_loss, max_count)
                ):
                    continue
                spec = workers[r.worker].spec  # type: ignore[index]
                if (model is not None and not spec.serves(model)) or (
                    for_class is not None and not spec.admits(for_class)
                ):
                    continue  # its slot could not serve the waiting request
                if helps is not None and not helps(r, spec.id):
                    continue  # stopping it would not let the waiting request start (GPU fleets)
                seen.add(r.id)
                taken += 1
                checkpoint_s, recompute_s = costs.round_trips(
                    r.prompt_tokens, r.tokens_done, now - r.started_s
                )
                out.append(
                    Candidate(
                        r.id,
                        spec.id,
                        v,
                        r.seq,
                        eta_of(r, now),
                        checkpoint_s,
                        recompute_s,
                        spec.can_checkpoint,
                        r.lost_s,
                    )
                )
    return out
