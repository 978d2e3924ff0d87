"""Modules that other code imports first import on their own (no import cycles)."""

from __future__ import annotations

import subprocess
import sys

import pytest

FIRST = [
    "laneway.api.params",  # batch validation parses lines with the API's parser
    "laneway.batch.validate",
    "laneway.batch.cli",
    "laneway.runtime",
    "laneway.store",
    "laneway.server",  # the composition of a server
    "laneway.batch.runner",
    "laneway.backends.factory",
    "laneway.cluster.codec",
    "laneway.cli",
]


@pytest.mark.parametrize("module", FIRST)
def test_imports_alone(module: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
