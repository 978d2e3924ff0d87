"""What a request will cost before it has a history: its size, at the speed measured so far.

The scheduler weighs victims and drains by each running request's expected
end. Measured service times are per class, and a class that has not
finished anything yet would borrow whatever was measured (say, 40 ms of
short urgent probes for a flood of 1,000-token batch jobs: the scheduler
would then wait for them to end "at once"). So every request carries a size
hint from what it says: its ``max_tokens`` (the server's
``default_max_tokens`` when it gives none) at the decode speed measured on
its model (the cost model's before any), plus its prompt at the prefill
speed. While it runs, its own pace revises the hint
(:meth:`laneway.core.Scheduler.progress`).
"""

from __future__ import annotations

from collections.abc import Callable

from laneway.core import CostModel
from laneway.generation import EMBEDDING, Job

CHARS_PER_TOKEN = 4  # a prompt's size in tokens, roughly, before any tokenizer saw it
WEIGHT = 0.2  # of a new measurement in the moving average


class Sizing:
    def __init__(
        self,
        costs: CostModel,
        default_max_tokens: int,
        context_of: Callable[[str], int | None] | None = None,
    ) -> None:
        self.costs = costs
        self.default_max_tokens = default_max_tokens
        self.decode_tokens_s: dict[str, float] = {}  # per model, measured on finished requests
        # a model's context in tokens, where its workers say it (None: not known)
        self.context_of = context_of

    def output_tokens(self, job: Job) -> int:
        """What ``job`` may make: its ``max_tokens`` (each choice), no more than its model's
        context where that is known (an engine ends a request there: vLLM caps a
        ``max_tokens`` past it), so that neither its size nor a quota's charge counts more."""
        if job.kind == EMBEDDING:
            return 0
        n = job.params.n
        limit = job.params.max_tokens or self.default_max_tokens
        context = self.context_of(job.model) if self.context_of is not None else None
        if context is not None and context < limit:
            limit = context
        return limit * n

    def prompt_tokens(self, job: Job) -> int:
        if isinstance(job.prompt, str):
            return len(job.prompt) // CHARS_PER_TOKEN + 1
        if isinstance(job.prompt, list):
            return len(job.prompt) if all(isinstance(t, int) for t in job.prompt) else 1
        if job.messages is not None:
            chars = sum(_chars(m.get("content")) for m in job.messages)
            return chars // CHARS_PER_TOKEN + 1
        return 1

    def service_s(self, job: Job) -> float:
        """Expected seconds of service for ``job``."""
        rate = self.decode_tokens_s.get(job.model, self.costs.decode_tokens_s)
        return self.prompt_tokens(job) / self.costs.prefill_tokens_s + self.output_tokens(job) / rate

    def observe(self, model: str, tokens: int, seconds: float) -> None:
        """A finished request of ``model`` made ``tokens`` in ``seconds`` after its first one."""
        if tokens < 2 or seconds <= 0:
            return
        rate = (tokens - 1) / seconds
        old = self.decode_tokens_s.get(model)
        self.decode_tokens_s[model] = rate if old is None else (1 - WEIGHT) * old + WEIGHT * rate


def _chars(content: object) -> int:
    """Characters of a message's content: a string, or a list of parts (their text)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0
