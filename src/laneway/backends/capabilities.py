"""What an upstream engine accepts and returns: learnt, not assumed.

Each OpenAI-compatible engine takes a different set of vLLM's extensions, and
an engine behind a URL may be replaced by another one. An upstream worker
keeps what it has learnt of its engine, and forgets it whenever the engine
was unreachable (it may come back as another one):

- ``token_ids``: it gives token ids when asked (``return_token_ids``: vLLM,
  SGLang). Learnt from the first answer: a 400 to a request that carried the
  field only because laneway added it is sent again at once without it, and
  the field is not sent again (resumes go by text); a 200 without ids says
  the field was ignored.
- ``id_prompts``: its ``/completions`` takes a prompt of token ids (how a
  preempted request resumes exactly). Learnt at the first resume by ids; a
  400 there resumes by text instead.
- ``continue_final``: its chat endpoint takes ``continue_final_message`` (how a
  chat request resumes by text). Learnt at the first such resume; a 400 there
  starts a request the client has not seen yet again from scratch, and from
  then on a chat request the client is reading is not preempted on it (it
  runs to its end: a preemption would have nothing to resume it by).
- ``metrics``: it serves Prometheus ``/metrics``, and whose (``vllm``,
  ``sglang``; ``""``: none). Asked when the engine is found up (a GET, no
  generation).
- ``kv_tokens``: its KV-cache space in tokens, as its ``/metrics`` says (vLLM's
  ``vllm:cache_config_info``: ``kv_cache_size_tokens``, else ``num_gpu_blocks`` x
  ``block_size``), read with ``metrics``: it bounds the prefix cache placement
  expects it to hold.

``None`` is "not known yet". Nothing here sends a generation of its own: a
question that costs a generation would run on the engine beside the slots
laneway gives out.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from laneway.backends.base import EngineState
from laneway.backends.http import HttpError, Pool

METRICS_TIMEOUT_S = 2.0
# an engine's /metrics is tens to hundreds of kB; one larger is not read (its patterns run
# on the event loop at every probe: 15 MB held it ~0.4 s)
MAX_METRICS_BYTES = 4 << 20
MAX_GAUGE = 1e12  # a gauge or counter past this is not a count (nor is a NaN, ±Inf or one below 0)


@dataclass
class Capabilities:
    token_ids: bool | None = None
    id_prompts: bool | None = None
    continue_final: bool | None = None
    metrics: str | None = None
    kv_tokens: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def forget(self) -> None:
        """The engine was unreachable: the one that comes back may be another."""
        self.token_ids = self.id_prompts = self.continue_final = None
        self.metrics = None
        self.kv_tokens = None


async def metrics_of(pool: Pool) -> tuple[str | None, int | None]:
    """Whose Prometheus metrics the engine serves at its root ``/metrics`` (``""``: none;
    ``None`` when it could not be asked), and its KV space in tokens if they say."""
    try:
        got = await pool.fetch("GET", "/metrics", timeout_s=METRICS_TIMEOUT_S, max_bytes=MAX_METRICS_BYTES)
    except HttpError:
        return None, None
    text = got.body.decode("utf-8", "replace") if got.status == 200 else ""
    kind = "vllm" if "vllm:" in text else "sglang" if "sglang:" in text else ""
    return kind, kv_tokens_in(text) if kind == "vllm" else sglang_kv_tokens_in(text) if kind else None


_SGLANG_KV = re.compile(r"^sglang:max_total_num_tokens(?:\{[^}]*\})? (\S+)$", re.M)


def sglang_kv_tokens_in(text: str) -> int | None:
    """The KV space in tokens that SGLang's ``sglang:max_total_num_tokens`` gives."""
    m = _SGLANG_KV.search(text)
    try:
        size = int(float(m.group(1))) if m is not None else 0
    except ValueError:
        return None
    return size if size > 0 else None


_CACHE_INFO = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def kv_tokens_in(text: str) -> int | None:
    """The KV space in tokens that vLLM's ``vllm:cache_config_info`` gives (``None``: not
    given)."""
    m = _CACHE_INFO.search(text)
    if m is None:
        return None
    labels = dict(_LABEL.findall(m.group(1)))
    try:
        size = labels.get("kv_cache_size_tokens", "")
        if size not in ("", "None"):
            return int(size) if int(size) > 0 else None
        blocks, block = int(labels["num_gpu_blocks"]), int(labels["block_size"])
    except (KeyError, ValueError):
        return None
    return blocks * block if blocks > 0 and block > 0 else None


# an engine's gauges of its load (running, waiting, KV use) and its prefix cache's
# counters (tokens looked up, tokens found): EngineState's fields, by engine
STATE_GAUGES: dict[str, tuple[str | None, ...]] = {
    "vllm": (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    ),
    # (SGLang: every prompt token counted, and those its radix cache held, by where it held them)
    "sglang": (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:prompt_tokens_total",
        "sglang:cached_tokens_total",
    ),
}


async def state_of(pool: Pool, model: str, kind: str) -> EngineState | None:
    """The engine's load for ``model`` by its ``/metrics`` (``kind``: whose they are);
    ``None`` when it cannot be told. Read with a pattern a gauge, not a full parse: it
    runs at every probe."""
    names = STATE_GAUGES.get(kind)
    if names is None:
        return None
    try:
        got = await pool.fetch("GET", "/metrics", timeout_s=METRICS_TIMEOUT_S, max_bytes=MAX_METRICS_BYTES)
    except HttpError:
        return None
    if got.status != 200:
        return None
    return state_in(got.body.decode("utf-8", "replace"), model, names)


def state_in(text: str, model: str, names: tuple[str | None, ...]) -> EngineState | None:
    """The figures ``names`` give for ``model`` in ``text`` (a sample may carry a timestamp);
    ``None`` where one is not a count (not a number, NaN, ±Inf, below 0, past
    :data:`MAX_GAUGE`): such an engine's figures are not believed."""
    values: list[float | None] = []
    for name in names:
        if name is None:
            values.append(None)
            continue
        total, seen = 0.0, False
        sample = rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)(?: -?\d+)?$"
        for labels, value in re.findall(sample, text, re.M):
            served = re.search(r'model_name="([^"]*)"', labels)
            if served is not None and served.group(1) != model:
                continue
            try:
                number = float(value)
            except ValueError:
                return None
            if not 0.0 <= number <= MAX_GAUGE:  # (False for NaN too)
                return None
            total += number
            seen = True
        values.append(total if seen else None)
    running, waiting, kv, queries, hits = values
    if running is None or waiting is None:
        return None
    if kv is not None and kv > 1.0:  # (a share: one past all of it is no figure of the cache)
        kv = None
    return EngineState(round(running), round(waiting), kv, queries, hits)
