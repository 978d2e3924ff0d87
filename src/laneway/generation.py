"""What a worker is asked to generate and what it reports back.

Plain, torch-free data shared by the in-process engine, the backends and the
runtime: :class:`SamplingParams` (validated on construction), :class:`Job`,
the events a running job emits, and :class:`Checkpoint`, the handle a
preempted job resumes from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from laneway.errors import InvalidRequest

MAX_STOP_STRINGS = 4


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens. ``temperature == 0`` is greedy; ``seed`` makes sampling repeatable.

    ``ignore_eos`` keeps generating past the end-of-text token (for benchmarks).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequest(
                f"max_tokens must be a whole number ≥ 1, got {self.max_tokens!r}", param="max_tokens"
            )
        _number_in("temperature", self.temperature, 0.0, 2.0, low_open=False)
        _number_in("top_p", self.top_p, 0.0, 1.0, low_open=True)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise InvalidRequest(f"seed must be an integer, got {self.seed!r}", param="seed")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop strings are allowed", param="stop")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequest("stop strings must be non-empty strings", param="stop")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _number_in(name: str, value: object, low: float, high: float, *, low_open: bool) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (low < value if low_open else low <= value) and value <= high
    if not ok:
        bracket = "(" if low_open else "["
        raise InvalidRequest(
            f"{name} must be a number in {bracket}{low:g}, {high:g}], got {value!r}", param=name
        )


@dataclass(frozen=True, slots=True)
class Job:
    """One generation: a raw ``prompt`` (completions) or chat ``messages``.

    ``continue_final`` (chat): the last message is an assistant message to
    continue rather than a finished turn (OpenAI-compatible servers call it
    ``continue_final_message``).
    """

    id: str
    model: str
    params: SamplingParams = field(default_factory=SamplingParams)
    prompt: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    continue_final: bool = False

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise InvalidRequest("give exactly one of prompt and messages")


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True, eq=False)
class Checkpoint:
    """Where a preempted job stopped; ``resume`` it on a worker of the same kind.

    ``mode`` is ``"checkpoint"`` (state kept: KV cache, RNG) or ``"recompute"``
    (only the ids: the prompt and the text so far are prefilled again).
    ``nbytes`` is what the saved state costs to hold; ``save_s`` what saving took.
    ``state`` is the worker's own payload.
    """

    job: Job
    mode: str
    tokens_done: int
    text_so_far: str
    nbytes: int = 0
    save_s: float = 0.0
    state: Any = None


# --- events a running job emits, in order: Delta* then one of Done / Stopped / Failed


@dataclass(frozen=True, slots=True)
class Delta:
    """New text, safe to show (it cannot turn out to be part of a stop string)."""

    job_id: str
    text: str
    tokens: int  # tokens generated so far


@dataclass(frozen=True, slots=True)
class Done:
    """The job ended: ``finish_reason`` is ``stop``, ``length`` or ``cancelled``."""

    job_id: str
    finish_reason: str
    usage: Usage
    text: str  # the whole completion text


@dataclass(frozen=True, slots=True)
class Stopped:
    """The job was preempted at a token boundary; its slot is free."""

    job_id: str
    checkpoint: Checkpoint


@dataclass(frozen=True, slots=True)
class Failed:
    job_id: str
    error: Exception


Event = Delta | Done | Stopped | Failed
