"""What a worker is asked to generate and what it reports back.

Plain, torch-free data shared by the in-process engine, the backends and the
runtime: :class:`SamplingParams` (validated on construction), :class:`Job`,
the events a running job emits, and :class:`Checkpoint`, the handle a
preempted job resumes from.

A job for an upstream worker also carries ``body``: the client's request as
sent, less the fields laneway owns, which the upstream gets verbatim. Its
events then carry the upstream's own chunks (``Delta.chunk``) and answer
(``Done.response`` / ``Done.chunks``), which reach the client unchanged but
for laneway's id, model name and ``laneway`` object.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from laneway.errors import InvalidRequest

MAX_STOP_STRINGS = 4
MAX_TOP_LOGPROBS = 20
MAX_CHOICES = 16  # n, in the built-in engine
GREEDY_BELOW = 1e-5  # a temperature under this is greedy (a smaller one only overflows the logits)
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what a 64-bit generator takes

CHAT, COMPLETION, EMBEDDING = "chat", "completion", "embedding"
RESPONSES = "responses"  # a Responses API request forwarded to an upstream's own (its body as sent)
RELAY = "relay"  # any other request to an upstream's endpoint (Job.endpoint), passed through as sent
KINDS = (CHAT, COMPLETION, EMBEDDING, RESPONSES, RELAY)


class ResumeRule(enum.StrEnum):
    """What a preemption may do to a job (``Job.resume``), as its request allows."""

    EXACT = "exact"  # resume it where it stopped (the worker says how: ResumeMethod)
    RESTART = "restart"  # start it again: its state cannot be resumed, and nothing was shown yet
    NONE = "none"  # never preempt it once started (drain only): streamed text cannot be taken back


class ResumeMethod(enum.StrEnum):
    """How a preempted job resumes on its worker: its checkpoint's ``mode``, and the
    ``laneway.resume`` a response reports."""

    CHECKPOINT = "checkpoint"  # its state kept (KV cache, RNG) and restored: exact
    RECOMPUTE = "recompute"  # its ids kept: the prompt and the text so far prefilled again
    TOKEN_IDS = "token_ids"  # an upstream takes the prompt and the ids made so far
    TEXT = "text"  # an upstream continues the text so far
    RESTART = "restart"  # from scratch
    NONE = "none"  # it is never stopped once started


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens. A temperature under :data:`GREEDY_BELOW` is greedy;
    ``seed`` makes sampling repeatable.

    ``ignore_eos`` keeps generating past the end-of-text token (for
    benchmarks). ``logprobs``: how many alternatives to report per token
    (0: only the chosen one's; ``None``: no log-probabilities). ``top_k`` 0 or
    -1 and ``min_p`` 0 are off. ``logit_bias`` pairs token ids with a bias
    added to their logits. ``min_tokens``: the end-of-text token and
    ``stop_token_ids`` cannot end the text before this many tokens.
    ``max_tokens`` is ``None`` when the client gave none (an upstream then
    applies its own default; the built-in engine's is the server's
    ``default_max_tokens``). ``return_token_ids``: report the prompt's and each
    generated token's id (vLLM's extension). ``max_tokens_from``: the field the client
    gave ``max_tokens`` in (a chat's ``max_completion_tokens`` where it gave that; errors
    name it); ``None`` where ``max_tokens`` is that default, not the client's: an engine
    lowers it to what its context leaves rather than refuse the request.
    """

    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    n: int = 1
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    return_token_ids: bool = False
    max_tokens_from: str | None = "max_tokens"

    def __post_init__(self) -> None:
        if self.max_tokens is not None and (not _whole(self.max_tokens) or self.max_tokens < 1):
            raise InvalidRequest(
                f"max_tokens must be a whole number ≥ 1, got {self.max_tokens!r}", param="max_tokens"
            )
        _number_in("temperature", self.temperature, 0.0, 2.0, low_open=False)
        _number_in("top_p", self.top_p, 0.0, 1.0, low_open=False)  # (0, as OpenAI takes it: the top token)
        if self.seed is not None and (
            not _whole(self.seed) or not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]
        ):
            raise InvalidRequest(f"seed must be a 64-bit integer, got {self.seed!r}", param="seed")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop strings are allowed", param="stop")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequest("stop strings must be non-empty strings", param="stop")
        if not _whole(self.n) or self.n < 1:
            raise InvalidRequest(f"n must be a whole number ≥ 1, got {self.n!r}", param="n")
        if self.logprobs is not None and (
            not _whole(self.logprobs) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS
        ):
            raise InvalidRequest(
                f"top_logprobs must be a whole number in 0–{MAX_TOP_LOGPROBS}, got {self.logprobs!r}",
                param="top_logprobs",
            )
        _number_in("presence_penalty", self.presence_penalty, -2.0, 2.0, low_open=False)
        _number_in("frequency_penalty", self.frequency_penalty, -2.0, 2.0, low_open=False)
        _number_in("repetition_penalty", self.repetition_penalty, 0.0, 2.0, low_open=True)
        if not _whole(self.top_k) or self.top_k < -1:
            raise InvalidRequest(
                f"top_k must be -1, 0 (off) or a whole number ≥ 1, got {self.top_k!r}", param="top_k"
            )
        _number_in("min_p", self.min_p, 0.0, 1.0, low_open=False)
        if not _whole(self.min_tokens) or self.min_tokens < 0:
            raise InvalidRequest(
                f"min_tokens must be a whole number ≥ 0, got {self.min_tokens!r}", param="min_tokens"
            )
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidRequest("min_tokens cannot be larger than max_tokens", param="min_tokens")
        if any(not _whole(t) or t < 0 for t in self.stop_token_ids):
            raise InvalidRequest(
                "stop_token_ids must be token ids (whole numbers ≥ 0)", param="stop_token_ids"
            )
        for token, bias in self.logit_bias:
            if not _whole(token) or token < 0:
                raise InvalidRequest("logit_bias keys must be token ids", param="logit_bias")
            _number_in("logit_bias", bias, -100.0, 100.0, low_open=False)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number_in(name: str, value: object, low: float, high: float, *, low_open: bool) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (low < value if low_open else low <= value) and value <= high  # type: ignore[operator]
    if not ok:
        bracket = "(" if low_open else "["
        raise InvalidRequest(
            f"{name} must be a number in {bracket}{low:g}, {high:g}], got {value!r}", param=name
        )


@dataclass(frozen=True, slots=True)
class Job:
    """One generation: a ``prompt`` (completions), chat ``messages`` or an
    embedding (``kind``).

    ``continue_final`` (chat): the last message is an assistant message to
    continue rather than a finished turn (OpenAI-compatible servers call it
    ``continue_final_message``). ``body``: for upstream workers, the client's
    fields laneway does not own, forwarded as sent. ``stream``: the client
    reads the answer as it is made. ``resume``: how a preemption may treat it
    (:class:`ResumeRule`; its string is taken too). ``rank``: its class, set where an
    upstream is told it (vLLM's ``priority``).
    """

    id: str
    model: str
    params: SamplingParams = field(default_factory=SamplingParams)
    prompt: Any = None  # a string (an upstream may also take token ids or several prompts)
    messages: tuple[dict[str, Any], ...] | None = None
    continue_final: bool = False
    kind: str = ""
    body: Mapping[str, Any] | None = None
    stream: bool = False
    resume: ResumeRule = ResumeRule.EXACT
    rank: int = 0  # its class (0: the most urgent), for an engine that orders its queue by it
    endpoint: str = ""  # a relayed job's path under the upstream's base URL ("messages")
    headers: tuple[tuple[str, str], ...] = ()  # a relayed job's client headers passed on (anthropic-*)

    def __post_init__(self) -> None:
        if not self.kind:
            if (self.prompt is None) == (self.messages is None):
                raise InvalidRequest("give exactly one of prompt and messages")
            object.__setattr__(self, "kind", CHAT if self.messages is not None else COMPLETION)
        elif self.kind not in KINDS:
            raise ValueError(f"unknown job kind {self.kind!r}")
        if self.resume not in tuple(ResumeRule):
            raise ValueError(f"unknown resume rule {self.resume!r}")
        object.__setattr__(self, "resume", ResumeRule(self.resume))


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A generated token's log-probability and the most likely alternatives at its step."""

    token: str
    logprob: float
    bytes: tuple[int, ...]
    top: tuple[tuple[str, float, tuple[int, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class Ending:
    """How one choice of a job ended (the built-in engine reports every choice)."""

    index: int
    text: str
    finish_reason: str
    logprobs: tuple[TokenLogprob, ...] | None = None
    token_ids: tuple[int, ...] | None = None  # every generated id, when asked


@dataclass(slots=True, eq=False)
class Checkpoint:
    """Where a preempted job stopped; ``resume`` it on a worker of the same kind.

    ``mode`` is how it resumes (:class:`ResumeMethod`): ``checkpoint`` (state kept: KV
    cache, RNG), ``recompute`` (only the ids: the prompt and the text so far are prefilled
    again), or what an upstream worker resumes by (``token_ids``, ``text``, ``restart``).
    ``nbytes`` is what the saved state costs to hold; ``save_s`` what saving took.
    ``state`` is the worker's own payload.
    """

    job: Job
    mode: ResumeMethod
    tokens_done: int
    text_so_far: str
    nbytes: int = 0
    save_s: float = 0.0
    state: Any = None


# --- events a running job emits, in order: Delta* then one of Done / Stopped / Failed


@dataclass(frozen=True, slots=True)
class Delta:
    """New text of choice ``index``, safe to show (it cannot turn out to be part of a stop string).

    ``logprobs`` and ``token_ids``: of the tokens generated since the last
    delta, when asked (``prompt_ids`` with the first). ``chunk``: an
    upstream's own chunk carrying it, to forward.
    """

    job_id: str
    text: str
    tokens: int  # tokens generated so far
    index: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None
    chunk: dict[str, Any] | None = None
    token_ids: tuple[int, ...] | None = None
    prompt_ids: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Done:
    """The job ended: ``finish_reason`` is ``stop``, ``length`` or ``cancelled`` (of choice 0).

    ``choices``: every choice's ending, where the worker reports them.
    ``response``: an upstream's whole answer (for a client that does not
    stream); ``chunks``: the last chunks of its stream (the one that ends it,
    and the usage one if the client asked).
    """

    job_id: str
    finish_reason: str
    usage: Usage
    text: str  # the whole completion text (of choice 0)
    choices: tuple[Ending, ...] = ()
    response: dict[str, Any] | None = None
    chunks: tuple[dict[str, Any], ...] = ()
    prompt_ids: tuple[int, ...] | None = None  # when asked (return_token_ids)
    # a relayed job's answer as the upstream sent it: a whole one's body and content type;
    # a stream's last bytes (its "data: [DONE]", if it sent one)
    raw: tuple[bytes, str] | None = None


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
