"""A Hugging Face model directory made by the test with ``save_pretrained`` loads offline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from laneway.engine.engine import Engine
from laneway.engine.models import load_model
from laneway.engine.tokenizer import HFTokenizer
from laneway.generation import Job

from .helpers import alone, greedy

CORPUS = ["the quick brown fox jumps over the lazy dog", "hello world, hello laneway", "priority lanes"]
TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]"


def make_model_dir(path: Path, *, template: bool) -> Path:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    if template:
        fast.chat_template = TEMPLATE
    fast.save_pretrained(path)
    cfg = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.mark.usefixtures("offline")
def test_saved_model_directory_loads_and_generates(tmp_path: Path) -> None:
    path = make_model_dir(tmp_path / "model", template=True)
    loaded = load_model(str(path), "cpu")
    assert isinstance(loaded.tokenizer, HFTokenizer)
    assert loaded.context == 256
    engine = Engine(loaded, 2, data_dir=tmp_path)
    done = alone(engine, Job("a", str(path), greedy(12), prompt="hello world"))
    assert done.usage.completion_tokens >= 1
    assert done.usage.prompt_tokens == len(loaded.tokenizer.encode("hello world"))
    # the chat template is used for messages
    ids = loaded.tokenizer.chat_prompt([{"role": "user", "content": "hello"}])
    assert loaded.tokenizer.decode(ids) == "[user] hello\n[assistant]"
    engine2 = Engine(load_model(str(path), "cpu"), 1, data_dir=tmp_path)
    again = alone(engine2, Job("a", "m", greedy(12), prompt="hello world"))
    assert again.text == done.text  # the saved weights, not a fresh random init


@pytest.mark.usefixtures("offline")
def test_directory_without_a_chat_template_falls_back_to_role_lines(tmp_path: Path) -> None:
    loaded = load_model(str(make_model_dir(tmp_path / "m", template=False)), "cpu")
    ids = loaded.tokenizer.chat_prompt([{"role": "user", "content": "hello"}])
    assert "hello" in loaded.tokenizer.decode(ids)


@pytest.mark.usefixtures("offline")
def test_builtin_model_saved_without_a_tokenizer_uses_bytes(tmp_path: Path) -> None:
    tiny = load_model("builtin:tiny", "cpu")
    tiny.model.save_pretrained(tmp_path / "tiny")
    loaded = load_model(str(tmp_path / "tiny"), "cpu")
    j = Job("t", "m", greedy(10), prompt="same weights")
    saved = alone(Engine(loaded, 1, data_dir=tmp_path), j).text
    assert saved == alone(Engine(tiny, 1, data_dir=tmp_path), j).text
