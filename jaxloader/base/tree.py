"""Pytrees with JAX's semantics, without importing JAX.

Workers must start fast and stay light, so they do not import JAX; this module flattens the
containers records are made of the way ``jax.tree_util`` does:

- ``dict`` and other mappings (rebuilt as ``dict``), ``OrderedDict`` and ``defaultdict`` (rebuilt
  as themselves), ``list``, ``tuple``, namedtuples;
- ``None``: an empty node, as in JAX (``{"mask": None}`` batches to ``{"mask": None}``);
- any class registered with JAX (``flax.struct.dataclass``, ``jax.tree_util.register_dataclass``,
  ``register_pytree_node``...): flattened one level at a time by JAX itself. Such a class's module
  imported JAX already, so JAX is asked only when it is in ``sys.modules``: a worker that reads
  plain records never imports it.

Anything else is a leaf. A treedef is plain, hashable, picklable data::

    ("leaf",) | ("none",) | ("dict", keys, children) | ("ordered", keys, children)
    | ("defaultdict", keys, factory, children) | ("list", children) | ("tuple", children)
    | ("namedtuple", cls, children) | ("node", cls, one_level, names, children)

where ``one_level`` is JAX's ``PyTreeDef`` of the node with its children as leaves, and ``names``
the children's key paths (``.x``). Children always come last.

Example:
    >>> leaves, treedef = flatten({"x": 1, "y": (2, 3), "z": None})
    >>> leaves, unflatten(treedef, [10, 20, 30])
    ([1, 2, 3], {'x': 10, 'y': (20, 30), 'z': None})
"""

from __future__ import annotations

import ast
import collections
import functools
import operator
import sys
from collections.abc import Mapping
from typing import Any, Callable, NoReturn

import numpy as np

from jaxloader.base.difference import keys_apart
from jaxloader.base.errors import CollateError

LEAF = ("leaf",)
NONE = ("none",)
TreeDef = tuple


def structure(tree: Any) -> TreeDef:
    """The treedef of ``tree``."""
    cls = type(tree)
    if cls is dict:
        keys = tuple(tree)
        return ("dict", keys, tuple(structure(tree[k]) for k in keys))
    if cls is list:
        return ("list", tuple(structure(c) for c in tree))
    if cls is tuple:
        return ("tuple", tuple(structure(c) for c in tree))
    if tree is None:
        return NONE
    kind = _kind(tree)
    if kind == "leaf":
        return LEAF
    if kind == "namedtuple":
        return ("namedtuple", cls, tuple(structure(c) for c in tree))
    if kind == "node":
        nodes, one_level, names = _jax_children(tree)
        return ("node", cls, one_level, names, tuple(structure(c) for c in nodes))
    keys = tuple(tree)
    children = tuple(structure(tree[k]) for k in keys)
    if kind == "defaultdict":
        return ("defaultdict", keys, tree.default_factory, children)
    return (kind, keys, children)  # "ordered" or "dict"


_KINDS: dict[type, str] = {}  # type -> how its instances flatten (JAX registers by type)


def _kind(tree: Any) -> str:
    """How ``tree`` (not a dict, list, tuple or None) is flattened: a kind of treedef."""
    cls = type(tree)
    kind = _KINDS.get(cls)
    if kind is not None:
        return kind
    # JAX is asked only once it is imported (and done importing: it has tree_util).
    jax = getattr(sys.modules.get("jax"), "tree_util", None) and sys.modules["jax"]
    if issubclass(cls, collections.OrderedDict):
        kind = "ordered"
    elif issubclass(cls, collections.defaultdict):
        kind = "defaultdict"
    elif issubclass(cls, tuple) and hasattr(cls, "_fields"):
        kind = "namedtuple"
    elif jax is not None and not isinstance(tree, _NEVER_NODES) and _jax_children(tree)[1] is not None:
        kind = "node"
    elif isinstance(tree, Mapping):
        kind = "dict"  # a mapping JAX does not know: rebuilt as a plain dict
    else:
        kind = "leaf"
    if kind != "leaf" or jax is not None:  # a leaf may turn out a node once JAX is imported
        _KINDS[cls] = kind
    return kind


# Leaves for certain, whatever is registered: no need to ask JAX about them.
_NEVER_NODES = (str, bytes, int, float, complex, bool, np.ndarray, np.generic)


def _jax_children(tree: Any) -> tuple[list, Any, tuple]:
    """JAX's one-level flattening of ``tree``: children, their treedef (None for a leaf) and
    the children's key paths."""
    jax = sys.modules["jax"]
    with_paths, one_level = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda c: c is not tree)
    if jax.tree_util.treedef_is_leaf(one_level) and with_paths and with_paths[0][1] is tree:
        return [], None, ()
    names = tuple(jax.tree_util.keystr(path) for path, _ in with_paths)
    return [c for _, c in with_paths], one_level, names


def _children(treedef: TreeDef) -> tuple:
    return () if len(treedef) == 1 else treedef[-1]


def flatten(tree: Any) -> tuple[list, TreeDef]:
    """The leaves of ``tree`` in treedef order, and its treedef."""
    treedef = structure(tree)
    return [column[0] for column in gather([tree], treedef)], treedef


def unflatten(treedef: TreeDef, leaves: list) -> Any:
    """Rebuilds a tree of ``treedef`` from its leaves (in order)."""
    if is_flat_dict(treedef):  # the common record: one dict() call, no recursion
        return dict(zip(treedef[1], leaves))
    it = iter(leaves)
    return _build(treedef, lambda: next(it))


@functools.lru_cache(maxsize=256)
def is_flat_dict(treedef: TreeDef) -> bool:
    """A dict whose values are all leaves (the common record)."""
    return treedef[0] == "dict" and all(c == LEAF for c in treedef[2])


def _build(treedef: TreeDef, next_leaf: Callable[[], Any]) -> Any:
    kind = treedef[0]
    if kind == "leaf":
        return next_leaf()
    if kind == "none":
        return None
    children = [_build(c, next_leaf) for c in treedef[-1]]
    if kind == "dict":
        return dict(zip(treedef[1], children))
    if kind == "list":
        return children
    if kind == "tuple":
        return tuple(children)
    if kind == "namedtuple":
        return treedef[1](*children)
    if kind == "node":
        return treedef[2].unflatten(children)
    if kind == "ordered":
        return collections.OrderedDict(zip(treedef[1], children))
    return collections.defaultdict(treedef[2], zip(treedef[1], children))


def _child_names(treedef: TreeDef) -> list[str]:
    kind = treedef[0]
    if kind in _MAPPINGS:
        return [f"[{k!r}]" for k in treedef[1]]
    if kind == "namedtuple":
        return [f".{f}" for f in treedef[1]._fields]
    if kind == "node":
        return list(treedef[3])
    return [f"[{i}]" for i in range(len(_children(treedef)))]


_MAPPINGS = ("dict", "ordered", "defaultdict")


@functools.lru_cache(maxsize=256)  # one treedef per data set in practice; formatting costs
def leaf_paths(treedef: TreeDef, prefix: str = "") -> list[str]:
    """Readable paths of the leaves, e.g. ``["['image']", "['label']"]`` (do not mutate)."""
    if treedef[0] == "leaf":
        return [prefix or "<root>"]
    return [p for n, c in zip(_child_names(treedef), _children(treedef))
            for p in leaf_paths(c, prefix + n)]


def gather(trees: list, treedef: TreeDef, names: Any = None, path: str = "") -> list[list]:
    """Transposes trees of one structure into one list per leaf (a column per leaf).

    Raises CollateError naming the leaf path and the first tree whose structure differs from
    ``treedef`` (``record_name(names, j)`` names ``trees[j]``).
    """
    columns: list[list] = []
    _gather(trees, treedef, names, path, columns)
    return columns


def _gather(trees: list, treedef: TreeDef, names: Any, path: str, out: list) -> None:
    kind = treedef[0]
    if kind == "leaf":
        out.append(trees)
        return
    if kind == "none":
        if any(t is not None for t in trees):
            _raise_mismatch(trees, treedef, names, path)
        return
    if kind in _MAPPINGS:
        keys = treedef[1]
        by_key = _dict_columns(trees, keys) if kind == "dict" else None
        if by_key is None:
            keyset = set(keys)  # (and of its kind: an OrderedDict among dicts is another
            want = Mapping if kind == "dict" else type(trees[0])  # structure to JAX)
            if not all(isinstance(t, want) and t.keys() == keyset and (
                    _kind(t) == kind if type(t) is not dict else kind == "dict") for t in trees):
                _raise_mismatch(trees, treedef, names, path)
            by_key = [[t[k] for t in trees] for k in keys]
        for k, child, values in zip(keys, treedef[-1], by_key):
            _gather(values, child, names, f"{path}[{k!r}]", out)
        return
    children = treedef[-1]
    if kind == "node":
        cls, one_level = treedef[1], treedef[2]
        if not all(type(t) is cls for t in trees):
            _raise_mismatch(trees, treedef, names, path)
        split = [_jax_children(t) for t in trees]
        if not all(s[1] == one_level for s in split):
            _raise_mismatch(trees, treedef, names, path)
        by_child = [[s[0][i] for s in split] for i in range(len(children))]
    else:
        want = treedef[1] if kind == "namedtuple" else (tuple if kind == "tuple" else list)
        # (its type itself: a namedtuple among tuples is another structure to JAX)
        if not all(type(t) is want and len(t) == len(children) for t in trees):
            _raise_mismatch(trees, treedef, names, path)
        by_child = [[t[i] for t in trees] for i in range(len(children))]
    for name, child, values in zip(_child_names(treedef), children, by_child):
        _gather(values, child, names, path + name, out)


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


class RecordNames:
    """How messages name a batch's records: by their positions in the epoch's order and, where
    they differ from them (a shuffled or filtered order), the source indices a user looks
    records up by; or by their rows in a stream's batch (no positions).

    Example:
        >>> names = RecordNames(np.array([16, 23]), np.array([3, 17]))
        >>> record_name(names, 1), record_name(names[1:], 0), record_name(RecordNames(), 2)
        ('record position 23 (source index 17)', 'record position 23 (source index 17)', 'row 2')
    """

    __slots__ = ("positions", "indices", "first_row", "origin")

    def __init__(self, positions: Any = None, indices: Any = None, first_row: int = 0,
                 origin: Callable[[int], str] | None = None) -> None:
        self.positions, self.indices, self.first_row = positions, indices, first_row
        self.origin = origin  # row (a stream's), or source index -> " (where it came from)"

    def __getitem__(self, rows: slice) -> "RecordNames":
        """The names of ``rows`` (a chunk's rows ``a:b`` of the batch), counted from 0 again."""
        if self.positions is None:
            return RecordNames(first_row=self.first_row + (rows.start or 0), origin=self.origin)
        return RecordNames(self.positions[rows],
                           None if self.indices is None else self.indices[rows],
                           origin=self.origin)

    def name(self, j: int) -> str:
        if self.positions is None:
            row = self.first_row + j
            return f"row {row}{self.origin(row) if self.origin is not None else ''}"
        position = int(self.positions[j])
        index = None if self.indices is None else int(self.indices[j])
        where = "" if self.origin is None else self.origin(position if index is None else index)
        return (f"record position {position}{where}" if index is None or index == position
                else f"record position {position} (source index {index}){where}")


def record_name(names: Any, j: int) -> str:
    """How messages name the ``j``-th record of a batch: by ``RecordNames``, by an array of
    record positions, or (``None``) as an item of a list."""
    if isinstance(names, RecordNames):
        return names.name(j)
    return f"record position {names[j]}" if names is not None else f"item {j}"


def with_leaf(treedef: TreeDef, key: str) -> TreeDef:
    """A dict treedef with one more leaf, ``key``, last."""
    return ("dict", (*treedef[1], key), (*treedef[2], LEAF))


def describe(treedef: TreeDef) -> str:
    """A short readable description of a structure, for error messages."""
    kind = treedef[0]
    if kind in _MAPPINGS:
        name = {"dict": "dict", "ordered": "OrderedDict", "defaultdict": "defaultdict"}[kind]
        return f"{name} with keys {sorted(map(str, treedef[1]))}"
    if kind == "namedtuple":
        return f"{treedef[1].__name__} of {len(treedef[2])} fields"
    if kind == "node":
        return f"{treedef[1].__name__} (a JAX pytree node: {treedef[2]})"
    if kind == "leaf":
        return "a leaf"
    if kind == "none":
        return "None"
    return f"{kind} of length {len(treedef[1])}"


def _top(treedef: TreeDef) -> tuple:
    """A node without its children's structure: what must match between records."""
    if treedef[0] in _MAPPINGS:
        return (treedef[0], frozenset(treedef[1]))
    return (*treedef[:-1], len(treedef[-1])) if len(treedef) > 1 else treedef


def _top_key(path: str) -> str | None:
    """The record's key a leaf's ``path`` (``"['ids']"``) names, where it is one of a dict
    record's own (not deeper, not a tuple's place); else ``None``."""
    try:
        key = ast.literal_eval(path[1:-1]) if path[:1] == "[" and path[-1:] == "]" else None
    except (ValueError, SyntaxError):  # (a deeper path: "['a']['b']")
        return None
    return key if isinstance(key, str) and path == f"[{key!r}]" else None


def _raise_mismatch(trees: list, treedef: TreeDef, names: Any, path: str) -> NoReturn:
    want = _top(treedef)
    for j, t in enumerate(trees):
        got = structure(t)
        if _top(got) != want:
            sequence = want[0] in ("list", "tuple") and got[0] == want[0]
            key = _top_key(path)  # (what a Pad pads: a record's key)
            remedy = (  # [5, 8, 13] and [5, 8]: token lists, which JAX sees as nodes
                f"a {want[0]} (of numbers, say) is a node of its items, not an array: "
                + (f"pad the lists to the batch's longest with jaxloader.Pad({key!r}) after "
                   "the Maps (it takes lists), " if key is not None else "")
                + "make them arrays of one length in a Map (np.asarray, padded or cropped"
                + (")" if key is not None else "; or move them to a key of the record, which "
                   "jaxloader.Pad pads)")
                + ", or pack token sequences with jaxloader.PackedSource (PackedStream for a "
                "stream)"
                if sequence else
                "a stream's JSON list of numbers becomes an array, but not an empty one (no "
                "dtype) nor one holding an int beyond int64 (kept Python ints, exact): make it "
                "an array in a Map (np.asarray(x, np.uint64) for such ints, np.zeros(0, "
                "np.int64) for an empty list)"
                if {want[0], got[0]} == {"list", "leaf"} else
                "make every record the same structure (a Map can add missing keys; a None "
                "where others have a value must become one: '' for a str, a fill number or "
                "an empty or masked array, and a flag where that must be told apart)")
            raise CollateError(  # (of 5,000 keys, the one that differs: ``keys_apart``)
                f"batch leaf {path or '<root>'}: records differ in structure: " + (
                    f"{record_name(names, j)} {apart}, against {record_name(names, 0)}; {remedy}" if (
                        apart := keys_apart(treedef, got)) else f"{record_name(names, 0)} has "
                    f"{describe(treedef)}, {record_name(names, j)} has {describe(got)}; {remedy}"))
    raise CollateError(f"batch leaf {path or '<root>'}: records differ in structure")


def skeleton(tree: Any) -> Any:
    """``tree``'s dicts, lists and tuples, keys in their order, with no leaves (``None``).

    Example:
        >>> skeleton({"z": [1, 2], "a": 3})
        {'z': [None, None], 'a': None}
    """
    if type(tree) in (list, tuple):
        return type(tree)(skeleton(v) for v in tree)
    return {k: skeleton(v) for k, v in tree.items()} if isinstance(tree, dict) else None


def reordered(out: Any, like: Any) -> Any:
    """``out``, its dicts' keys in the order of ``like`` (its ``skeleton``): ``jax.jit`` sorts them.

    Example:
        >>> reordered({"a": 1, "z": {"c": 2, "b": 3}}, {"z": {"b": None, "c": None}, "a": None})
        {'z': {'b': 3, 'c': 2}, 'a': 1}
    """
    if isinstance(out, dict) and isinstance(like, dict) and like.keys() == out.keys():
        made = {k: reordered(out[k], like[k]) for k in like}  # (an OrderedDict's, a
        return collections.defaultdict(out.default_factory, made) if isinstance(  # defaultdict's
            out, collections.defaultdict) else collections.OrderedDict(made) if type(  # kind kept)
                out) is collections.OrderedDict else made
    if type(out) in (list, tuple) and type(like) is type(out) and len(like) == len(out):
        return type(out)(reordered(o, lk) for o, lk in zip(out, like))
    return out
