"""The configurations the docs show are ones laneway accepts: every TOML block in README.md
and docs/ is TOML, and each whole one (a `[fleet]` or `[[workers]]` block; the others are
parts to add to one) loads, its placeholder key digests aside. (README's GPU fleet once asked
150 GB of two 72 GB GPUs: `laneway serve` refused it.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from laneway.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "0" * 64  # (in place of "<printf %s KEY | sha256sum>")


def blocks() -> list[tuple[str, int, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"```toml\n(.*?)```", text, re.S):
            found.append((path.name, text[: m.start()].count("\n") + 1, m.group(1)))
    return found


def test_every_toml_block_in_the_docs_is_toml_and_each_whole_one_loads() -> None:
    found = blocks()
    assert len(found) >= 4
    whole = 0
    for name, line, block in found:
        data = tomllib.loads(re.sub(r'"<[^">]*>"', f'"{DIGEST}"', block))
        first = block.lstrip().splitlines()[0].split("#")[0].strip()
        if first in ("[fleet]", "[[workers]]"):
            whole += 1
            try:
                parse_config(data)
            except Exception as exc:
                raise AssertionError(f"{name}:{line}: {exc}") from None
    assert whole >= 2
