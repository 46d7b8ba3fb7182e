"""Pytrees of plain containers, without importing JAX.

Workers must start fast and stay light, so they do not import JAX; this module handles the
containers records are made of: ``dict`` (and other mappings), ``list``, ``tuple`` and
namedtuples. Anything else is a leaf. A treedef is plain, hashable, picklable data::

    ("leaf",) | ("dict", keys, children) | ("list", children) | ("tuple", children)
    | ("namedtuple", cls, children)

Example:
    >>> leaves, treedef = flatten({"x": 1, "y": (2, 3)})
    >>> leaves, unflatten(treedef, [10, 20, 30])
    ([1, 2, 3], {'x': 10, 'y': (20, 30)})
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from typing import Any, Callable

from jaxloader.errors import CollateError

LEAF = ("leaf",)
TreeDef = tuple


def structure(tree: Any) -> TreeDef:
    """The treedef of ``tree``."""
    if isinstance(tree, Mapping):
        keys = tuple(tree.keys())
        return ("dict", keys, tuple(structure(tree[k]) for k in keys))
    if isinstance(tree, tuple):
        children = tuple(structure(c) for c in tree)
        if hasattr(tree, "_fields"):
            return ("namedtuple", type(tree), children)
        return ("tuple", children)
    if isinstance(tree, list):
        return ("list", tuple(structure(c) for c in tree))
    return LEAF


def _children(treedef: TreeDef) -> tuple:
    return () if treedef[0] == "leaf" else treedef[-1]


def flatten(tree: Any) -> tuple[list, TreeDef]:
    """The leaves of ``tree`` in treedef order, and its treedef."""
    treedef = structure(tree)
    return [column[0] for column in gather([tree], treedef)], treedef


def unflatten(treedef: TreeDef, leaves: list) -> Any:
    """Rebuilds a tree of ``treedef`` from its leaves (in order)."""
    if _is_flat_dict(treedef):  # the common record: one dict() call, no recursion
        return dict(zip(treedef[1], leaves))
    it = iter(leaves)
    return _build(treedef, lambda: next(it))


@functools.lru_cache(maxsize=256)
def _is_flat_dict(treedef: TreeDef) -> bool:
    return treedef[0] == "dict" and all(c == LEAF for c in treedef[2])


def _build(treedef: TreeDef, next_leaf: Callable[[], Any]) -> Any:
    kind = treedef[0]
    if kind == "leaf":
        return next_leaf()
    children = [_build(c, next_leaf) for c in _children(treedef)]
    if kind == "dict":
        return dict(zip(treedef[1], children))
    if kind == "namedtuple":
        return treedef[1](*children)
    return tuple(children) if kind == "tuple" else children


@functools.lru_cache(maxsize=256)  # one treedef per data set in practice; formatting costs
def leaf_paths(treedef: TreeDef, prefix: str = "") -> list[str]:
    """Readable paths of the leaves, e.g. ``["['image']", "['label']"]`` (do not mutate)."""
    kind = treedef[0]
    if kind == "leaf":
        return [prefix or "<root>"]
    if kind == "dict":
        names = [f"[{k!r}]" for k in treedef[1]]
    elif kind == "namedtuple":
        names = [f".{f}" for f in treedef[1]._fields]
    else:
        names = [f"[{i}]" for i in range(len(treedef[-1]))]
    return [p for n, c in zip(names, treedef[-1]) for p in leaf_paths(c, prefix + n)]


def gather(trees: list, treedef: TreeDef, positions: Any = None, path: str = "") -> list[list]:
    """Transposes trees of one structure into one list per leaf (a column per leaf).

    Raises CollateError naming the leaf path and the record position of the first tree whose
    structure differs from ``treedef``. ``positions[j]`` names ``trees[j]`` in messages.
    """
    columns: list[list] = []
    _gather(trees, treedef, positions, path, columns)
    return columns


def _gather(trees: list, treedef: TreeDef, positions: Any, path: str, out: list) -> None:
    kind = treedef[0]
    if kind == "leaf":
        out.append(trees)
        return
    if kind == "dict":
        keys = treedef[1]
        by_key = _dict_columns(trees, keys)
        if by_key is None:
            keyset = set(keys)
            if not all(isinstance(t, Mapping) and t.keys() == keyset for t in trees):
                _raise_mismatch(trees, treedef, positions, path)
            by_key = [[t[k] for t in trees] for k in keys]
        for k, child, values in zip(keys, treedef[2], by_key):
            _gather(values, child, positions, f"{path}[{k!r}]", out)
        return
    children = treedef[-1]
    want = treedef[1] if kind == "namedtuple" else (tuple if kind == "tuple" else list)
    if not all(isinstance(t, want) and len(t) == len(children) for t in trees):
        _raise_mismatch(trees, treedef, positions, path)
    for i, child in enumerate(children):
        name = f".{treedef[1]._fields[i]}" if kind == "namedtuple" else f"[{i}]"
        _gather([t[i] for t in trees], child, positions, path + name, out)


def _dict_columns(trees: list, keys: tuple) -> list | None:
    """One list per key when every tree is a plain dict with exactly ``keys``, else None.

    All in C: each dict has ``len(keys)`` entries and every key (so no other key), or None.
    """
    if set(map(type, trees)) != {dict} or set(map(len, trees)) != {len(keys)}:
        return None
    try:
        return [list(map(operator.itemgetter(k), trees)) for k in keys]
    except KeyError:
        return None


def describe(treedef: TreeDef) -> str:
    """A short readable description of a structure, for error messages."""
    kind = treedef[0]
    if kind == "dict":
        return f"dict with keys {sorted(map(str, treedef[1]))}"
    if kind == "namedtuple":
        return f"{treedef[1].__name__} of {len(treedef[2])} fields"
    if kind == "leaf":
        return "a leaf"
    return f"{kind} of length {len(treedef[1])}"


def _raise_mismatch(trees: list, treedef: TreeDef, positions: Any, path: str) -> None:
    for j, t in enumerate(trees):
        got = structure(t)
        if got[:2] != treedef[:2] or len(_children(got)) != len(_children(treedef)):
            where = f"record position {positions[j]}" if positions is not None else f"item {j}"
            first = f"record position {positions[0]}" if positions is not None else "item 0"
            raise CollateError(
                f"batch leaf {path or '<root>'}: records differ in structure: {first} has "
                f"{describe(treedef)}, {where} has {describe(got)}; make every record the "
                "same structure (a Map can add missing keys)"
            )
    raise CollateError(f"batch leaf {path or '<root>'}: records differ in structure")
