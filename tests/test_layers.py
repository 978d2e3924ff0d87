"""The packages of laneway and what each may import of the others: the layers of
docs/architecture.md, kept. An import across packages that is not listed here fails, so a
new dependency is a decision made here, in one line, and not by accident.

Every import counts: at the top of a module, inside a function, or for type checking
only. Each unit is a package of ``src/laneway`` (``core``, ``runtime``, ...) or a module
at its top (``cli``, ``server``, ...)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import laneway

ROOT = Path(laneway.__path__[0])

# unit -> the units it may import (besides itself), lowest layer first
ALLOWED: dict[str, frozenset[str]] = {
    name: frozenset(deps)
    for name, deps in {
        # the policy: pure, imports nothing of laneway (tests/core/test_purity.py says more)
        "core": (),
        "errors": ("core",),
        "config": ("core",),
        "logs": (),
        "private_files": (),  # a data directory's files, readable by their owner only
        "arguments": (),  # argparse types of the commands
        "tracing": ("core",),
        "generation": ("errors",),
        "protocol": ("config", "errors", "generation"),
        "engine": ("errors", "generation"),
        # the bus of a cluster's replicas (Redis, or one in this process for tests)
        "bus": (),
        "store": ("bus", "core", "private_files"),
        "sim": ("core",),
        "backends": ("config", "core", "engine", "errors", "generation", "protocol"),
        "runtime": ("backends", "config", "core", "errors", "generation", "logs", "protocol", "tracing"),
        "cluster": ("bus", "config", "core", "logs", "private_files", "runtime"),
        "batch": (
            "arguments",
            "config",
            "core",
            "errors",
            "generation",
            "logs",
            "protocol",
            "runtime",
            "store",
        ),
        # the composition of a server: workers, runtime (or a cluster's), store, batches
        "server": ("backends", "batch", "cluster", "config", "runtime", "store", "tracing"),
        "connections": ("errors",),
        "api": (
            "backends",
            "batch",
            "config",
            "errors",
            "generation",
            "protocol",
            "runtime",
            "server",
            "store",
        ),
        "stopping": ("logs",),
        "serve": (
            "api",
            "arguments",
            "backends",
            "config",
            "connections",
            "core",
            "logs",
            "stopping",
            "store",
        ),
        "cli": ("__version__", "arguments", "batch", "cluster", "config", "core", "serve", "sim"),
        "entry": ("cli",),
        # shipped for tests and benchmarks: real processes on loopback
        "standin_adapters": (),
        "standin_text": (),
        "standin_answers": ("standin_text",),
        "standin": ("arguments", "standin_adapters", "standin_answers", "standin_text"),
        "testing": (),
        "fault_harness": ("testing",),
    }.items()
}


def unit_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported_units(source: str) -> set[str]:
    """The units of laneway that ``source`` imports (anywhere in it)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] != "laneway":
                continue
            if len(parts) == 1:
                out.update(a.name for a in node.names)
            else:
                out.add(parts[1])
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(
                f"a relative import (from {'.' * node.level}{node.module}): use the full name"
            )
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("laneway."))
    return out


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        u = unit_of(path)
        if u == "__init__":
            continue
        edges.setdefault(u, set()).update(imported_units(path.read_text(encoding="utf-8")) - {u})
    return edges


def test_every_unit_has_its_place() -> None:
    assert set(graph()) == set(ALLOWED), "a unit of src/laneway is missing from ALLOWED (or is gone)"


@pytest.mark.parametrize("unit", sorted(ALLOWED))
def test_a_unit_imports_only_what_it_may(unit: str) -> None:
    assert graph().get(unit, set()) - ALLOWED[unit] == set()


def test_the_layers_have_no_cycle() -> None:
    seen: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(u: str, path: list[str]) -> None:
        if seen.get(u) == 2:
            return
        assert seen.get(u) != 1, " -> ".join([*path, u])
        seen[u] = 1
        for v in sorted(ALLOWED.get(u, ())):
            visit(v, [*path, u])
        seen[u] = 2

    for u in sorted(ALLOWED):
        visit(u, [])


@pytest.mark.parametrize(
    ("source", "units"),
    [
        ("from laneway.core import Scheduler", {"core"}),
        ("from laneway.runtime.runtime import Runtime", {"runtime"}),
        ("import laneway.store.sqlite", {"store"}),
        ("from laneway import __version__, cli", {"__version__", "cli"}),
        ("def f():\n    from laneway.cluster.node import join\n", {"cluster"}),
        ("import json\nfrom starlette.routing import Route", set()),
    ],
)
def test_the_checker_itself(source: str, units: set[str]) -> None:
    assert imported_units(source) == units
