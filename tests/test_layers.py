"""The package's house: folders are layers, and every import (inside functions too) goes down
a layer or stays in its own, with no cycle; a module holds one concept (at most 400 lines).

    base -> order -> plans -> runtime -> sources, streams -> batching
         -> execution (engines, workers, sharding) -> loaders -> derived -> top (mix, checkpoint, profile, profiling, ray)

The allow-list of exceptions is empty, and stays so: an import that needs to go up is a seam
where a small protocol belongs (docs/architecture.md).
"""

from __future__ import annotations

import ast
import functools
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "jaxloader")
LAYERS = [  # bottom first: a module may import its own layer's and those below
    ("base",), ("order",), ("plans",), ("runtime",), ("sources", "streams"), ("batching",),
    ("engines", "workers", "sharding"), ("loaders",), ("derived",), ("mix", "checkpoint", "profile", "profiling", "ray", "ray_actor", "ray_streams", "ray_tasks", ""),
]
ALLOWED: set[tuple[str, str]] = set()  # (importer, imported): empty, and stays so
MAX_LINES = 400


@functools.cache
def _modules() -> dict[str, str]:
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def _imports(module: str, path: str, known: set[str]) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in it."""
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names]
            names = [n for n in names if n in known] or [base]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def _layer(module: str) -> int:
    first = module.split(".")[1] if "." in module else ""
    for rank, folders in enumerate(LAYERS):
        if first in folders:
            return rank
    raise AssertionError(f"{module}: in no layer; add its folder to LAYERS (and to "
                         "docs/architecture.md)")


GRAPH = {m: _imports(m, p, set(_modules())) for m, p in _modules().items()}


def test_every_import_goes_down_a_layer_or_stays_in_its_own():
    upward = sorted(f"{m} ({LAYERS[_layer(m)][0]}) imports {i} ({LAYERS[_layer(i)][0]})"
                    for m, imported in GRAPH.items() for i in imported
                    if _layer(i) > _layer(m) and (m, i) not in ALLOWED)
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, cycles


@pytest.mark.parametrize("module", sorted(_modules()))
def test_a_module_holds_one_concept(module):
    lines = sum(1 for _ in open(_modules()[module], encoding="utf-8"))
    assert lines <= MAX_LINES, f"{module}: {lines} lines; split it by concept"


def test_the_allow_list_is_empty():
    assert not ALLOWED
