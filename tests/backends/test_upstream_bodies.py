"""What an upstream run sends: its class as vLLM's ``priority`` where the worker forwards
it — on every kind laneway sends, embeddings too — and the worker's extra fields."""

from __future__ import annotations

import pytest

from laneway.backends.upstream_body import Bodies
from laneway.backends.upstream_run import Run
from laneway.generation import CHAT, COMPLETION, EMBEDDING, Job, SamplingParams


def body_of(kind: str, forward: bool) -> dict[str, object]:
    bodies = Bodies("up", "served-m", token_ids="none", options={"top_k": 5}, forward_priority=forward)
    client = {"model": "m", "input": "text"} if kind == EMBEDDING else {"model": "m", "prompt": "p"}
    job = Job("j", "m", SamplingParams(max_tokens=4), prompt="p", kind=kind, body=client, rank=3)
    run = Run(job, lambda event: None, "up")
    return bodies.of(run)[1]


@pytest.mark.parametrize("kind", [CHAT, COMPLETION, EMBEDDING])
def test_a_forwarded_class_goes_with_every_kind(kind: str) -> None:
    body = body_of(kind, forward=True)
    assert body["priority"] == 3 and body["model"] == "served-m" and body["top_k"] == 5
    assert "priority" not in body_of(kind, forward=False)
