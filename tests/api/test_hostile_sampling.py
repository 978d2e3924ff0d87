"""A hostile request between two normal ones, all three on one worker (the in-process
engine, in one batch): for every sampler field, the normal ones succeed, the hostile
one gets its own answer (200 or 4xx, never a 5xx) and the worker stays up."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from laneway.config import ServerConfig
from live_server import LiveServer, live_server, tiny

TINY = "builtin:tiny"
HUGE = 10**18
HOSTILE: dict[str, list[Any]] = {
    "temperature": [1e-40, 1e-300, 5e-324, 0.0, 2.0, 1e-5, -0.0, 1e308, -1, "1", None, True],
    "top_p": [1e-40, 5e-324, 1e-300, 1.0, 0.0, -1, 1e308],
    "top_k": [1, -1, 0, 2**31, HUGE, -HUGE, 1.5],
    "min_p": [1.0, 1e-40, 0.999999999, 0.0, -0.1, 2.0],
    "presence_penalty": [2.0, -2.0, 1e-300, 1e308, -1e308],
    "frequency_penalty": [2.0, -2.0, 5e-324, 1e308],
    "repetition_penalty": [1e-40, 5e-324, 1e-300, 2.0, 1e308, 0.0, -1.0],
    "logit_bias": [
        {"0": 100},
        {"1": -100},
        {str(i): 100 for i in range(50)},
        {"-1": 1},
        {"9999999": 1},
        {"0": 1e308},
        {"0": "x"},
        {"x": 1},
        [],
        "a",
    ],
    "seed": [2**63 - 1, -(2**63), 2**64 - 1, 0, -1, 1.5],
    "max_tokens": [1, 2**31, HUGE, 0, -1, 1.0],
    "min_tokens": [8, 10_000, -1, HUGE],
    "stop": ["", "a", ["a", "b", "c", "d"], [""] * 4, ["x"] * 5, "\u0000", "😀" * 100],
    "stop_token_ids": [[0, 1, 2], [-1], [HUGE], list(range(200)), "x"],
    "logprobs": [True, 5, -1, "yes"],
    "top_logprobs": [0, 20, 21, -1],
    "n": [1, 4, 0, -1, 10_000],
    "ignore_eos": [True, "no", 1],
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    cfg = replace(
        ServerConfig(),
        workers=(tiny(4),),
        data_dir=tmp_path_factory.mktemp("hostile"),
    )
    with live_server(cfg) as server:
        yield server


def _body(**extra: Any) -> dict[str, Any]:
    return {
        "model": TINY,
        "messages": [{"role": "user", "content": "one two three"}],
        "max_tokens": 8,
        "temperature": 0.0,
        **extra,
    }


async def _trio(c: httpx.AsyncClient, field: str, value: Any) -> list[httpx.Response]:
    hostile = _body(**{field: value})
    if field == "top_logprobs":
        hostile["logprobs"] = True
    calls = [c.post("/chat/completions", json=b) for b in (_body(), hostile, _body())]
    return list(await asyncio.gather(*calls))


@pytest.mark.parametrize("field", sorted(HOSTILE))
def test_a_hostile_request_never_hurts_its_neighbours(engine: LiveServer, field: str) -> None:
    async def go() -> None:
        async with httpx.AsyncClient(base_url=engine.base_url, timeout=60) as c:
            want = (await c.post("/chat/completions", json=_body())).json()["choices"][0]["message"]
            for value in HOSTILE[field]:
                first, hostile, last = await _trio(c, field, value)
                for normal in (first, last):
                    assert normal.status_code == 200, (field, value, normal.text)
                    assert normal.json()["choices"][0]["message"] == want, (field, value)
                assert hostile.status_code in (200, 400), (field, value, hostile.status_code, hostile.text)
                if hostile.status_code == 400:
                    assert hostile.json()["error"]["type"] == "invalid_request_error"
            ready = await c.get(engine.url + "/readyz")
            assert ready.status_code == 200, ready.text

    asyncio.run(go())
