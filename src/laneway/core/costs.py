"""What preemption costs, from KV-cache bytes and host-link bandwidth.

Defaults describe a 7B Llama-class model (fp16, 32 layers, hidden 4096, full
multi-head attention) on one datacentre GPU:

- KV cache per token: 2 (K and V) x 32 layers x 4096 x 2 bytes = 512 KiB;
- host link (PCIe 4.0 x16, pinned memory): ~16 GB/s each way;
- prefill ~8,000 tokens/s, decode ~30 tokens/s per sequence in a batch;
- a preemption lands at a token boundary: one decode step (~33 ms).

So checkpointing a request that holds 2,000 tokens moves ~1 GiB: ~65 ms to
save and as much to restore; recomputing it re-prefills 2,000 tokens: ~0.25 s.
Requests given only a duration are converted to tokens with the decode speed.

A worker that reports what its checkpoints really cost (bytes, tokens held,
seconds to save) replaces these defaults as measurements come in
(:meth:`CostModel.observed`), so victim choice weighs real figures.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from laneway.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class CostModel:
    kv_bytes_per_token: int = 2 * 32 * 4096 * 2
    host_link_bytes_s: float = 16e9
    prefill_tokens_s: float = 8000.0
    decode_tokens_s: float = 30.0
    step_s: float = 1 / 30
    default_prompt_tokens: int = 512

    def __post_init__(self) -> None:
        for name in ("host_link_bytes_s", "prefill_tokens_s", "decode_tokens_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"costs.{name}: must be > 0")
        if self.kv_bytes_per_token < 0 or self.step_s < 0 or self.default_prompt_tokens < 0:
            raise ConfigError("costs: sizes and times must be >= 0")

    def observed(self, nbytes: int, tokens: int, save_s: float | None, weight: float = 0.3) -> CostModel:
        """This model moved toward one measured checkpoint (an exponential average).

        ``nbytes`` of KV cache for ``tokens`` held gives the bytes per token;
        ``save_s`` (the copy alone) gives the host-link bandwidth.
        """
        if nbytes <= 0 or tokens <= 0:
            return self
        per_token = (1 - weight) * self.kv_bytes_per_token + weight * nbytes / tokens
        link = self.host_link_bytes_s
        if save_s is not None and save_s > 0:
            link = (1 - weight) * link + weight * nbytes / save_s
        return replace(self, kv_bytes_per_token=max(round(per_token), 1), host_link_bytes_s=link)

    def tokens_held(self, prompt_tokens: int, generated: int) -> int:
        return (prompt_tokens or self.default_prompt_tokens) + generated

    def generated_in(self, service_s: float) -> int:
        """Output tokens a sequence decodes in ``service_s`` seconds."""
        return int(max(service_s, 0.0) * self.decode_tokens_s)

    def checkpoint_bytes(self, tokens: int) -> int:
        return tokens * self.kv_bytes_per_token

    def save_s(self, tokens: int) -> float:
        """Preempt with a checkpoint: reach a token boundary, copy KV to the host."""
        return self.step_s + self.checkpoint_bytes(tokens) / self.host_link_bytes_s

    def restore_s(self, tokens: int) -> float:
        return self.checkpoint_bytes(tokens) / self.host_link_bytes_s

    def recompute_s(self, tokens: int) -> float:
        """Resume by re-prefilling every token held (prompt plus output so far)."""
        return tokens / self.prefill_tokens_s

    def checkpoint_cost_s(self, tokens: int) -> float:
        """Slot time a checkpoint round trip costs (save plus restore)."""
        return self.save_s(tokens) + self.restore_s(tokens)

    def recompute_cost_s(self, tokens: int) -> float:
        return self.step_s + self.recompute_s(tokens)

    def round_trips(self, prompt_tokens: int, generated: int, running_s: float) -> tuple[float, float]:
        """``(checkpoint_cost_s, recompute_cost_s)`` of a request that holds
        ``prompt + generated`` tokens plus what it decoded in ``running_s``."""
        # the arithmetic of tokens_held, generated_in, checkpoint_cost_s and
        # recompute_cost_s in one place: it runs for every victim candidate
        held = (prompt_tokens or self.default_prompt_tokens) + generated
        if running_s > 0:
            held += int(running_s * self.decode_tokens_s)
        moved = held * self.kv_bytes_per_token / self.host_link_bytes_s
        return self.step_s + 2 * moved, self.step_s + held / self.prefill_tokens_s
