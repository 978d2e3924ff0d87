"""Request bodies → jobs (no server needed)."""

from __future__ import annotations

import pytest

from laneway.api.params import parse_job
from laneway.config import ServerConfig
from laneway.errors import InvalidRequest

MODELS = ("builtin:tiny",)


def body(**extra: object) -> dict[str, object]:
    return {"model": "builtin:tiny", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_ignore_eos_is_taken_from_the_body() -> None:
    assert parse_job(body(), True, ServerConfig(), MODELS).job.params.ignore_eos is False
    assert parse_job(body(ignore_eos=True), True, ServerConfig(), MODELS).job.params.ignore_eos is True
    with pytest.raises(InvalidRequest) as info:
        parse_job(body(ignore_eos="yes"), True, ServerConfig(), MODELS)
    assert info.value.param == "ignore_eos"
