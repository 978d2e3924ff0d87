"""What the in-process engine keeps of each job: a running sequence (:class:`Seq`), its
payload in a checkpoint (:class:`SavedState`), and the engine's own figures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from laneway.engine.checkpoints import SavedKV
from laneway.engine.detok import TextState
from laneway.engine.kv_batch import KV
from laneway.generation import Event, Job, TokenLogprob

Sink = Callable[[Event], None]


@dataclass(eq=False)
class Seq:
    job: Job
    sink: Sink
    ids: list[int]  # prompt + generated
    prompt_len: int
    max_new: int
    gen: torch.Generator | None
    text: TextState
    kv_len: int = 0  # tokens in the KV cache; the next input is ids[kv_len:]
    restored: KV | None = None  # a checkpointed cache waiting to join the batch
    partial: DynamicCache | None = None  # its prompt's cache while prefilled chunk by chunk
    row: int = -1
    logprobs: list[TokenLogprob] | None = None  # of every generated token, when asked
    lp_sent: int = 0  # of those, how many went out with a delta
    ids_sent: int = -1  # generated ids that went out with a delta (-1: not even the prompt's; or not asked)

    @property
    def generated(self) -> int:
        return len(self.ids) - self.prompt_len


@dataclass
class SavedState:
    """The engine's payload in a :class:`Checkpoint`."""

    model: str
    ids: list[int]
    prompt_len: int
    max_new: int
    emitted: int
    rng: torch.Tensor | None
    kv: SavedKV | None = None
    kv_len: int = 0
    logprobs: list[TokenLogprob] | None = None
    lp_sent: int = 0
    ids_sent: int = -1


@dataclass
class EngineStats:
    steps: int = 0
    tokens: int = 0  # generated tokens
    prefill_tokens: int = 0
    busy_s: float = 0.0
    preemptions: int = 0
    checkpoint_bytes: int = 0
    step_s_last: float = 0.0
    by_batch: dict[int, tuple[int, float]] = field(default_factory=dict)  # batch size -> (steps, seconds)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.busy_s if self.busy_s else 0.0
