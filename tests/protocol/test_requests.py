"""Request bodies → jobs (no server needed)."""

from __future__ import annotations

import pytest

from laneway.config import ServerConfig
from laneway.errors import InvalidRequest
from laneway.generation import CHAT
from laneway.protocol.requests import Support, parse_request

BUILTIN = {"builtin:tiny": Support(False, frozenset({"n", "logprobs"}))}


def body(**extra: object) -> dict[str, object]:
    return {"model": "builtin:tiny", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_ignore_eos_is_taken_from_the_body() -> None:
    assert parse_request(body(), CHAT, ServerConfig(), BUILTIN).job.params.ignore_eos is False
    assert parse_request(body(ignore_eos=True), CHAT, ServerConfig(), BUILTIN).job.params.ignore_eos is True
    with pytest.raises(InvalidRequest) as info:
        parse_request(body(ignore_eos="yes"), CHAT, ServerConfig(), BUILTIN)
    assert info.value.param == "ignore_eos"
