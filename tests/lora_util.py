"""A LoRA adapter made locally for tests: random weights for the attention's q and v
projections of a Llama-shaped base, in PEFT's file layout (``adapter_config.json``,
``adapter_model.safetensors``), which vLLM loads."""

from __future__ import annotations

import json
from pathlib import Path


def make_adapter(base: Path, out: Path, *, seed: int, rank: int = 8) -> Path:
    """An adapter of the model in ``base`` (its ``config.json``) written to ``out``."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((base / "config.json").read_text(encoding="utf-8"))
    hidden, heads, kv_heads = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for proj, width in (("q_proj", heads * head_dim), ("v_proj", kv_heads * head_dim)):
            key = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            # (B is zero in a fresh PEFT adapter; random here, so the adapter changes answers)
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, hidden, generator=g) * 0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(width, rank, generator=g) * 0.5
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": ["q_proj", "v_proj"],
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "base_model_name_or_path": str(base),
    }
    (out / "adapter_config.json").write_text(json.dumps(config), encoding="utf-8")
    return out
