"""Every third-party package the code imports is a declared runtime dependency.

A plain ``pip install .`` (the gateway install) must be enough to run every command
but the built-in engine, whose packages (torch, transformers) are the ``engine`` extra
that README command 1 installs and only ``laneway/engine/`` may import, and traces, whose
OpenTelemetry packages are the ``otel`` extra that only ``laneway/tracing.py`` may import;
test-only packages (pytest, hypothesis) belong to the ``dev`` extra.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_imports_are_declared_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = {_name(r) for r in project["dependencies"]}
    engine = declared | {_name(r) for r in project["optional-dependencies"]["engine"]}
    otel = declared | {_name(r) for r in project["optional-dependencies"]["otel"]}
    engine_dir = ROOT / "src" / "laneway" / "engine"
    tracing = ROOT / "src" / "laneway" / "tracing.py"
    dists = packages_distributions()
    missing: dict[str, set[str]] = {}
    for path in sorted((ROOT / "src" / "laneway").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                if top == "laneway" or top in sys.stdlib_module_names:
                    continue
                names = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
                allowed = engine if engine_dir in path.parents else otel if path == tracing else declared
                if not names & allowed:
                    missing.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    assert not missing, f"imported but not in [project.dependencies]: {missing}"
