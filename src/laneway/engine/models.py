"""Model specs and loading.

A spec is ``builtin:tiny`` / ``builtin:small`` (a small Llama made locally from
a fixed seed with a byte tokenizer: no download), ``builtin:smollm2`` (a real model,
SmolLM2-135M-Instruct, prepared once into the cache: :mod:`laneway.engine.prepared`) or the
path of a local Hugging Face model directory, loaded offline.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from laneway.engine.prepared import PREPARED, PrepareError, prepared
from laneway.engine.tokenizer import BOS_ID, BYTE_VOCAB, EOS_ID, PAD_ID, ByteTokenizer, HFTokenizer, Tokenizer
from laneway.errors import DeviceUnavailable, ModelLoadError, ModelNotFound

log = logging.getLogger("laneway.engine")

BUILTIN_SEED = 1234

# name -> (hidden, layers, heads, kv heads, intermediate, context)
BUILTINS: dict[str, tuple[int, int, int, int, int, int]] = {
    "tiny": (64, 2, 4, 2, 128, 2048),  # ~0.1M parameters: tests
    "small": (768, 8, 12, 4, 2048, 2048),  # ~50M parameters: benchmarks
}

NAMES = (*BUILTINS, *PREPARED)  # every built-in name


@dataclass
class LoadedModel:
    name: str  # the spec it was loaded from
    model: Any  # a transformers causal LM, in eval mode
    tokenizer: Tokenizer
    config: Any
    context: int  # tokens the model can attend to
    device: torch.device
    parameters: int


def resolve_device(device: str | None) -> torch.device:
    """``None``/``"auto"``: CUDA when there is one, else CPU."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise DeviceUnavailable(f"unknown device {device!r}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable("device 'cuda' asked for, but no CUDA GPU is available")
    return dev


def load_model(spec: str, device: str | None = None) -> LoadedModel:
    """Load ``spec`` onto ``device``; raise :class:`ModelNotFound` / :class:`ModelLoadError`."""
    dev = resolve_device(device)
    if spec.removeprefix("builtin:") in PREPARED and spec.startswith("builtin:"):
        try:
            directory = prepared(spec.removeprefix("builtin:"), say=log.info)
        except PrepareError as exc:
            raise ModelLoadError(f"cannot load model {spec!r}: {exc}") from None
        return _from_directory(spec, directory, dev)
    if spec.startswith("builtin:"):
        return _builtin(spec, dev)
    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelNotFound(
            f"unknown model {spec!r}: not a built-in model ({', '.join('builtin:' + n for n in NAMES)}) "
            "and no such directory"
        )
    return _from_directory(spec, path, dev)


def _builtin(spec: str, dev: torch.device) -> LoadedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    name = spec.removeprefix("builtin:")
    if name not in BUILTINS:
        raise ModelNotFound(f"unknown built-in model {spec!r}; built-in: {', '.join(NAMES)}")
    hidden, layers, heads, kv_heads, inter, context = BUILTINS[name]
    cfg = LlamaConfig(
        vocab_size=BYTE_VOCAB,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=context,
        initializer_range=0.2,  # spread logits apart: random text rather than near-ties
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        tie_word_embeddings=False,
    )
    fork = [dev] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=fork):
        torch.manual_seed(BUILTIN_SEED)
        model = LlamaForCausalLM(cfg)
    model = model.to(dev).eval()  # type: ignore[arg-type]  # (transformers types .to as a wrapper)
    return LoadedModel(spec, model, ByteTokenizer(), cfg, context, dev, _count(model))


def _from_directory(spec: str, path: Path, dev: torch.device) -> LoadedModel:
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ModelLoadError(f"cannot load model {spec!r}: not a model directory (no config.json)")
    if not os.access(path / "config.json", os.R_OK):
        raise ModelLoadError(f"cannot load model {spec!r}: config.json is not readable")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # transformers raises many kinds; name the directory and the cause
        raise ModelLoadError(f"cannot load model {spec!r}: {exc}") from exc
    try:
        tok: Tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(path, local_files_only=True))
    except Exception:
        if getattr(model.config, "vocab_size", 0) != BYTE_VOCAB:
            raise ModelLoadError(f"cannot load model {spec!r}: it has no tokenizer") from None
        tok = ByteTokenizer()  # a built-in model saved with save_pretrained
    cfg = model.config
    context = int(getattr(cfg, "max_position_embeddings", 2048) or 2048)
    model = model.to(dev).eval()  # type: ignore[arg-type]  # (transformers types .to as a wrapper)
    return LoadedModel(spec, model, tok, cfg, context, dev, _count(model))


def _count(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())
