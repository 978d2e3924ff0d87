"""Generation features of the engine: batching, sampling, stops, streaming, cancellation, errors."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from laneway.engine.engine import Engine
from laneway.engine.models import LoadedModel, load_model
from laneway.engine.tokenizer import ByteTokenizer
from laneway.errors import ContextTooLong, InvalidRequest, ModelLoadError, ModelNotFound
from laneway.generation import Delta, Done, Job, SamplingParams

from .helpers import Collector, alone, greedy, job, run_all


@given(st.text())
def test_byte_tokenizer_round_trips_any_text(text: str) -> None:
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text)) == text


def test_batched_decode_gives_each_request_its_solo_text(engine: Engine) -> None:
    prompts = ["a", "a much longer prompt than the others, by far", "mid-sized prompt", "ünïcödé ✓"]
    jobs = [job(f"j{i}", p, greedy(16 + 4 * i)) for i, p in enumerate(prompts)]
    refs = {j.id: alone(engine, j) for j in jobs}
    col = Collector()
    engine.add(jobs[0], col.sink("j0"))
    engine.step()
    engine.step()
    for j in jobs[1:]:  # join while the first is mid-way; they leave at different steps
        engine.add(j, col.sink(j.id))
    sizes = []
    while engine.has_work:
        engine.step()
        sizes.append(len(engine.rows))
    assert max(sizes) == 4  # they really ran as one batch
    for j in jobs:
        assert col.done(j.id).text == refs[j.id].text
        assert col.done(j.id).usage == refs[j.id].usage


def test_max_tokens_and_usage(engine: Engine) -> None:
    done = alone(engine, job("m", "count", greedy(7)))
    assert done.finish_reason == "length"
    assert done.usage.completion_tokens == 7
    assert done.usage.prompt_tokens == len(ByteTokenizer().encode("count"))


def test_stop_string_ends_the_text_before_it_and_is_never_streamed(engine: Engine) -> None:
    ref = alone(engine, job("r", "stop here", greedy(40))).text
    stop = ref[12:15]
    first = ref.find(stop)
    col = Collector()
    engine.add(job("s", "stop here", greedy(40, stop=(stop, "never-appears"))), col.sink("s"))
    run_all(engine, col)
    done = col.done("s")
    assert done.finish_reason == "stop"
    assert done.text == ref[:first]
    assert col.streamed("s") == ref[:first]


def test_eos_ends_generation(tiny: LoadedModel, tmp_path) -> None:
    ref = alone(Engine(tiny, 1, data_dir=tmp_path), job("r", "eos", greedy(20))).text
    tok = ByteTokenizer()
    eos_token = tok.encode(ref[5])[1]  # the sixth token the model makes

    class Eos(ByteTokenizer):
        eos_ids = frozenset({eos_token})

    engine = Engine(replace(tiny, tokenizer=Eos()), 1, data_dir=tmp_path)
    done = alone(engine, job("e", "eos", greedy(20)))
    assert done.finish_reason == "stop"
    assert done.text == ref[: ref.index(ref[5])]


def test_sampling_seed_temperature_and_top_p(engine: Engine) -> None:
    def text(**kw: object) -> str:
        return alone(engine, job("x", "sample", SamplingParams(max_tokens=30, **kw))).text  # type: ignore[arg-type]

    assert text(temperature=1.0, seed=1) == text(temperature=1.0, seed=1)
    assert text(temperature=1.0, seed=1) != text(temperature=1.0, seed=2)
    greedy_text = text(temperature=0.0)
    assert text(temperature=1.0, top_p=1e-9, seed=3) == greedy_text  # only the top token survives


def test_tokens_stream_as_they_are_made(engine: Engine) -> None:
    col = Collector()
    engine.add(job("t", "stream", greedy(20)), col.sink("t"))
    seen = []
    while engine.has_work:
        engine.step()
        seen.append(len(col.events["t"]))
    deltas = [e for e in col.events["t"] if isinstance(e, Delta)]
    assert len(deltas) >= 15  # printable ASCII: about one delta per token
    assert seen[:3] == [1, 2, 3]  # one event per step, before the job ends
    assert [d.tokens for d in deltas] == sorted(d.tokens for d in deltas)


def test_cancel_at_any_time_frees_the_slot(engine: Engine) -> None:
    col = Collector()
    engine.add(job("c1"), col.sink("c1"))
    assert engine.cancel("c1")  # before it started
    engine.add(job("c2", params=greedy(50)), col.sink("c2"))
    engine.add(job("c3", params=greedy(50)), col.sink("c3"))
    for _ in range(5):
        engine.step()
    assert engine.cancel("c2")  # mid-way, in a batch of two
    assert not engine.cancel("c2")
    for e in ("c1", "c2"):
        assert col.done(e).finish_reason == "cancelled"
    assert engine.busy == 1 and len(engine.rows) == 1
    run_all(engine, col)
    assert col.done("c3").usage.completion_tokens == 50
    assert alone(engine, job("c3", params=greedy(50))).text == col.done("c3").text


def test_all_slots_busy_is_refused(tiny: LoadedModel, tmp_path) -> None:
    from laneway.errors import BackendError

    engine = Engine(tiny, 1, data_dir=tmp_path)
    engine.add(job("a"), Collector().sink("a"))
    with pytest.raises(BackendError, match="slots are busy"):
        engine.add(job("b"), Collector().sink("b"))


def test_prompt_longer_than_context(engine: Engine) -> None:
    with pytest.raises(ContextTooLong, match="at most 2047 prompt tokens"):
        engine.add(job("long", "x" * 5000), Collector().sink("long"))
    assert engine.busy == 0


def test_prompt_plus_max_tokens_must_fit_the_context(engine: Engine) -> None:
    with pytest.raises(ContextTooLong, match="lower max_tokens to at most 7") as err:
        engine.add(job("edge", "y" * 2040, greedy(100)), Collector().sink("edge"))
    assert err.value.param == "max_tokens"
    done = alone(engine, job("edge", "y" * 2040, greedy(7, ignore_eos=True)))
    assert done.finish_reason == "length"
    assert done.usage.prompt_tokens + done.usage.completion_tokens == engine.model.context


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": -0.1}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"seed": "x"}, "seed"),
        ({"stop": ("",)}, "stop"),
        ({"stop": ("a", "b", "c", "d", "e")}, "stop"),
    ],
)
def test_invalid_sampling_parameters(kw: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        SamplingParams(**kw)  # type: ignore[arg-type]
    assert err.value.param == param and err.value.status == 400


def test_job_needs_exactly_one_of_prompt_and_messages() -> None:
    with pytest.raises(InvalidRequest):
        Job("j", "m")
    with pytest.raises(InvalidRequest):
        Job("j", "m", prompt="a", messages=({"role": "user", "content": "b"},))


def test_a_prompt_of_no_token_at_all_is_refused(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """(a tokenizer with no special token to start an empty text from: a 400, not a failed prefill)"""
    monkeypatch.setattr(engine.model.tokenizer, "encode", lambda text: [])
    with pytest.raises(InvalidRequest) as err:
        engine.prompt_ids(Job("j", "builtin:tiny", prompt=""))
    assert err.value.param == "prompt" and "no token" in str(err.value)


def test_chat_messages_use_the_template(engine: Engine) -> None:
    msgs = (
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    )
    ids = engine.prompt_ids(Job("c", "m", messages=msgs))
    assert ByteTokenizer().decode(ids) == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    done = alone(engine, Job("c", "builtin:tiny", greedy(5), messages=msgs))
    assert isinstance(done, Done) and done.usage.prompt_tokens == len(ids)


def test_unknown_model_specs(tmp_path) -> None:
    with pytest.raises(ModelNotFound, match="builtin:huge"):
        load_model("builtin:huge", "cpu")
    with pytest.raises(ModelNotFound, match="no such directory"):
        load_model(str(tmp_path / "nope"), "cpu")
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_model(str(tmp_path), "cpu")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="cannot load model"):
        load_model(str(tmp_path), "cpu")


def test_chat_continue_final_message_continues_the_text(engine: Engine) -> None:
    msgs = ({"role": "user", "content": "tell me"},)
    whole = alone(engine, Job("w", "builtin:tiny", greedy(30), messages=msgs)).text
    partial = (*msgs, {"role": "assistant", "content": whole[:12]})
    rest = alone(engine, Job("r", "builtin:tiny", greedy(18), messages=partial, continue_final=True))
    assert whole[:12] + rest.text == whole
