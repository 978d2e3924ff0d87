#!/usr/bin/env python3
"""A tiny random Llama with a byte-level BPE tokenizer trained here, for a real vLLM in tests.

    python scripts/make_tiny_bpe_llama.py OUT_DIR [--vocab 2048] [--hidden 128] [--layers 2]

Nothing is downloaded. The tokenizer is trained on ASCII lines of this Python's
standard library, with only the characters seen there as its alphabet, so every
token decodes to printable ASCII and a random model never writes half a UTF-8
character. A BPE tokenizer matters: text re-tokenized after a preemption can
split differently from the tokens that were generated, so only a resume by
token ids is exact on it. The chat template is ChatML; ``<|im_end|>`` is the
end of text, and its output row is scaled up so that greedy text sometimes
ends by itself. The other special tokens are never generated. Seeded: the same
arguments make the same model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

UNK, BOS, START, END = "<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MAX_LEN = 2048


def training_text(limit_files: int = 200) -> list[str]:
    """Printable ASCII lines of the standard library's top-level modules."""
    lib = Path(json.__file__).parent.parent
    lines = []
    for path in sorted(lib.glob("*.py"))[:limit_files]:
        for line in path.read_text(encoding="utf-8", errors="ignore").splitlines(keepends=True):
            if line.isascii() and all(c.isprintable() or c == "\n" for c in line):
                lines.append(line)
    return lines


def tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    raw = Tokenizer(models.BPE(unk_token=UNK))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, min_frequency=2, special_tokens=[UNK, BOS, START, END], show_progress=False
    )
    raw.train_from_iterator(training_text(), trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=END,
        pad_token=BOS,
        model_max_length=MAX_LEN,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHATML
    return tok


def model(tok: PreTrainedTokenizerFast, hidden: int, layers: int) -> LlamaForCausalLM:
    ids = {s: tok.convert_tokens_to_ids(s) for s in (UNK, BOS, START, END)}
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=MAX_LEN,
        initializer_range=0.05,
        tie_word_embeddings=False,
        bos_token_id=ids[BOS],
        eos_token_id=ids[END],
        pad_token_id=ids[BOS],
        torch_dtype="float32",
    )
    m = LlamaForCausalLM(config)
    with torch.no_grad():
        rows = m.lm_head.weight
        rows.mul_(4.0)  # sharp logits: greedy choices are no near-ties that batching could flip
        for special in (UNK, BOS, START):
            rows[ids[special]].zero_()
        rows[ids[END]].mul_(3.0)
    m.generation_config = GenerationConfig(
        bos_token_id=ids[BOS], eos_token_id=[ids[END]], pad_token_id=ids[BOS]
    )
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    tok = tokenizer(args.vocab)
    m = model(tok, args.hidden, args.layers)
    args.out.mkdir(parents=True, exist_ok=True)
    m.save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)
    cfg_path = args.out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHATML  # readers that look only here find it too
    cfg_path.write_text(json.dumps(cfg, indent=2))
    sample = "def f(x):\n    return x + 1  # ok"
    assert tok.decode(tok(sample)["input_ids"]) == sample, "the tokenizer does not round-trip"
    params = sum(p.numel() for p in m.parameters())
    print(f"{args.out}: vocab {len(tok)}, {params / 1e6:.2f}M parameters, float32, ChatML template")


if __name__ == "__main__":
    main()
