"""The core is pure policy: no I/O, no concurrency, no torch, nothing from the
rest of laneway (DESIGN §4)."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import laneway.core

FORBIDDEN = frozenset(
    {"asyncio", "socket", "threading", "subprocess", "os", "io", "pathlib", "time", "torch"}
)
PACKAGE = "laneway.core"


def _modules() -> list[str]:
    names = [PACKAGE]
    names += [f"{PACKAGE}.{m.name}" for m in pkgutil.iter_modules(laneway.core.__path__)]
    return sorted(names)


def bad_imports(source: str, module: str) -> list[str]:
    """Names imported by ``source`` (the text of ``module``) that the core may not import."""
    package = module if module == PACKAGE else module.rsplit(".", 1)[0]
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            # "from laneway import sim" imports laneway.sim
            targets = [target] if node.module else [f"{target}.{alias.name}" for alias in node.names]
            if target == "laneway":
                targets = [f"laneway.{alias.name}" for alias in node.names]
        else:
            continue
        found += [name for name in targets if _forbidden(name)]
    return found


def _forbidden(name: str) -> bool:
    top = name.split(".")[0]
    # the bare parent package is fine: what it would load shows up as laneway.<name>
    outside_core = name.startswith("laneway.") and name != PACKAGE and not name.startswith(PACKAGE + ".")
    return top in FORBIDDEN or outside_core


@pytest.mark.parametrize("module", _modules())
def test_module_imports_stay_inside_the_core(module: str) -> None:
    mod = importlib.import_module(module)
    assert mod.__file__ is not None
    source = Path(mod.__file__).read_text(encoding="utf-8")
    assert bad_imports(source, module) == []


def test_every_source_file_is_checked() -> None:
    files = {p.stem for p in Path(laneway.core.__path__[0]).glob("*.py")}
    checked = {m.rsplit(".", 1)[1] if m != PACKAGE else "__init__" for m in _modules()}
    assert files == checked
    assert {"scheduler", "request", "preemption", "admission"} <= checked


@pytest.mark.parametrize(
    ("source", "module", "bad"),
    [
        ("import os", "laneway.core.x", ["os"]),
        ("import os.path", "laneway.core.x", ["os.path"]),
        ("from time import monotonic", "laneway.core.x", ["time"]),
        ("import asyncio as aio", "laneway.core.x", ["asyncio"]),
        ("def f():\n    import torch\n", "laneway.core.x", ["torch"]),
        ("from laneway.sim import engine", "laneway.core.x", ["laneway.sim"]),
        ("from laneway import sim", "laneway.core.x", ["laneway.sim"]),
        ("import laneway.runtime", "laneway.core.x", ["laneway.runtime"]),
        ("from ..api import app", "laneway.core.x", ["laneway.api"]),
        ("from .. import store", "laneway.core.x", ["laneway.store"]),
        ("from .request import Request", "laneway.core.x", []),
        ("from . import request", "laneway.core.x", []),
        ("from laneway.core.request import Request", "laneway.core.x", []),
        ("from laneway import core", "laneway.core.x", []),
        ("import heapq, math\nfrom collections import deque", "laneway.core.x", []),
        ("import iota", "laneway.core.x", []),
        ("import laneway", "laneway.core.x", []),
    ],
)
def test_the_checker_itself(source: str, module: str, bad: list[str]) -> None:
    assert bad_imports(source, module) == bad


def test_importing_the_core_loads_nothing_forbidden() -> None:
    code = (
        "import sys, json\n"
        "before = set(sys.modules)\n"
        "import laneway.core\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    assert "laneway.core.scheduler" in loaded
    assert [m for m in loaded if _forbidden(m)] == []
