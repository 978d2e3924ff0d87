"""How loaded a worker of fixed slots is: the share of its slots it runs, and the prompts
it still prefills counted as more running requests."""

from __future__ import annotations

from laneway.core.request import Request
from laneway.core.workers import WorkerState

# A request whose prompt its worker still prefills weighs one more running request there
# for every PREFILL_TOKENS_A_SLOT tokens of it left to prefill: a prefill is compute-bound
# and shares the engine with a new one, where a decoding request costs it little
# (measured on vLLM's CPU engines of SmolLM2: a 1,337-token prefill took 13 s beside
# another where alone it took 6.7 s; beside a decoding request 1.14-1.22x).
PREFILL_TOKENS_A_SLOT = 256


def load(w: WorkerState) -> float:
    """The share of the slots it may use that a worker runs (held slots count)."""
    usable = w.usable
    return 1.0 - w.free / usable if usable > 0 else 1.0


def prefill_load(w: WorkerState) -> float:
    """:func:`load` with the prompts its requests still prefill counted as more of them."""
    share = load(w)
    return share + w.prefill / (PREFILL_TOKENS_A_SLOT * w.usable) if w.prefill else share


class SlotShare:
    """The share of its usable slots a worker runs (held slots count): the lowest wins."""

    def score(self, req: Request, w: WorkerState, now: float) -> float:
        return load(w)


SLOT_SHARE = SlotShare()
