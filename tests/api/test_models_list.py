"""``GET /v1/models``: the served models, their aliases (each also listed, with ``root``)
and, where the workers say, their context length (``max_model_len``). A request for an
alias is answered with the name the client used."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from laneway.config import parse_config
from live_server import LiveServer, live_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    cfg = parse_config(
        {
            "server": {"data_dir": str(tmp_path_factory.mktemp("models"))},
            "workers": [
                {"name": "tiny", "type": "local", "model": "builtin:tiny", "slots": 1},
                {"name": "sim0", "type": "simulated", "model": "sim", "slots": 1},
            ],
            "models": {"builtin:tiny": {"aliases": ["gpt-4o-mini", "small"]}},
        }
    )
    with live_server(cfg) as s:
        yield s


def test_models_list_aliases_and_context_lengths(server: LiveServer) -> None:
    data = {m["id"]: m for m in httpx.get(server.base_url + "/models").json()["data"]}
    assert list(data) == ["builtin:tiny", "sim", "gpt-4o-mini", "small"]
    tiny = data["builtin:tiny"]
    assert tiny["aliases"] == ["gpt-4o-mini", "small"] and tiny["root"] == "builtin:tiny"
    context = server.runtime.workers["tiny"].engine.model.context  # type: ignore[attr-defined]
    assert tiny["max_model_len"] == context > 0
    assert data["small"]["root"] == "builtin:tiny" and data["small"]["max_model_len"] == context
    assert "max_model_len" not in data["sim"] and data["sim"]["aliases"] == []
    c = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
    assert [m.id for m in c.models.list().data] == list(data)
    got = c.models.retrieve("gpt-4o-mini")
    assert got.id == "gpt-4o-mini" and (got.model_extra or {}).get("root") == "builtin:tiny"
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("gpt-9")


def test_an_alias_is_answered_with_the_name_the_client_used(server: LiveServer) -> None:
    c = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0)
    said = [{"role": "user", "content": "hi"}]
    chat = c.chat.completions.create(model="gpt-4o-mini", messages=said, max_tokens=2)  # type: ignore[arg-type]
    assert chat.model == "gpt-4o-mini" and chat.choices[0].message.content is not None
    stream = c.chat.completions.create(model="small", messages=said, max_tokens=2, stream=True)  # type: ignore[arg-type]
    assert {chunk.model for chunk in stream} == {"small"}
    assert c.completions.create(model="small", prompt="a", max_tokens=2).model == "small"
    assert c.responses.create(model="small", input="hi", max_output_tokens=2).model == "small"
    assert (
        c.chat.completions.create(model="builtin:tiny", messages=said, max_tokens=2).model == "builtin:tiny"
    )  # type: ignore[arg-type]


def test_an_upstreams_context_length_comes_from_its_models_list(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from laneway.testing import standin_process

    tmp = tmp_path_factory.mktemp("up")
    with standin_process(tmp / "standin.log") as engine:
        cfg = parse_config(
            {
                "server": {"data_dir": str(tmp / "data")},
                "workers": [
                    {
                        "name": "up",
                        "type": "upstream",
                        "url": engine.url,
                        "model": "standin",
                        "served_name": "m",
                    }
                ],
            }
        )
        with live_server(cfg) as s:
            [m] = httpx.get(s.base_url + "/models").json()["data"]
    assert m["id"] == "m" and m["max_model_len"] == 4096  # as the stand-in says, like vLLM
