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

``None`` is "not known yet". Nothing here sends a generation of its own: a
question that costs a generation would run on the engine beside the slots
laneway gives out.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from laneway.backends.http import HttpError, Pool

METRICS_TIMEOUT_S = 2.0


@dataclass
class Capabilities:
    token_ids: bool | None = None
    id_prompts: bool | None = None
    continue_final: bool | None = None
    metrics: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def forget(self) -> None:
        """The engine was unreachable: the one that comes back may be another."""
        self.token_ids = self.id_prompts = self.continue_final = None
        self.metrics = None


async def metrics_of(pool: Pool) -> str | None:
    """Whose Prometheus metrics the engine serves at its root ``/metrics`` (``""``: none);
    ``None`` when it could not be asked."""
    try:
        got = await pool.fetch("GET", "/metrics", timeout_s=METRICS_TIMEOUT_S, max_bytes=16 << 20)
    except HttpError:
        return None
    text = got.body.decode("utf-8", "replace") if got.status == 200 else ""
    return "vllm" if "vllm:" in text else "sglang" if "sglang:" in text else ""


# the gauges an engine counts its requests in, running and queued (vLLM, SGLang)
LOAD_GAUGES = {
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
}


async def load_of(pool: Pool, model: str, kind: str) -> int | None:
    """The requests the engine runs or queues for ``model`` by its own ``/metrics`` (``kind``:
    whose metrics they are); ``None`` when it cannot be told."""
    from prometheus_client.parser import text_string_to_metric_families

    names = LOAD_GAUGES.get(kind)
    if names is None:
        return None
    try:
        got = await pool.fetch("GET", "/metrics", timeout_s=METRICS_TIMEOUT_S, max_bytes=16 << 20)
    except HttpError:
        return None
    if got.status != 200:
        return None
    total = 0.0
    seen = False
    try:
        for family in text_string_to_metric_families(got.body.decode("utf-8", "replace")):
            for sample in family.samples:
                if sample.name in names and sample.labels.get("model_name", model) == model:
                    total += sample.value
                    seen = True
    except ValueError:
        return None
    return round(total) if seen else None
