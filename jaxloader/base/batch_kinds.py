"""Every batch a loader hands out has the leaves, dtypes and ranks of its first.

A batch is collated from its own records, which must agree with each other; nothing made two
batches agree. A JSON number written ``1`` in one record and ``1.5`` in the next made an int64
batch and a float64 one (with a batch size of 2; ``CollateError`` with 4, where both met), a
``ConcatSource``'s parts of other dtypes made batches of each in turn, and a ``BatchMap`` could
return another structure for some steps: the training step was compiled again, or failed far
from the cause. What stays on the host is compared by kind alone: strings (``str``, whatever
their width) and bytes, Python ones too (a leaf of objects by its first value's type); a leaf
of other objects (ragged rows) with anything, as a list feature is rows of one length stacked
in one batch and ragged rows in the next. Shapes
are compared by rank (a ``BatchMap`` may pad to each batch's longest).

Example:
    >>> import numpy as np
    >>> kinds = BatchKinds()
    >>> kinds.check({"x": np.zeros(4, np.int64)}, 0, lambda step: f"step {step}")
    >>> kinds.check({"x": np.zeros(4)}, 1, lambda step: f"step {step}")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    jaxloader.base.errors.CollateError: step 1: batch leaf ['x'] is float64 (1-D), where ...
"""

from __future__ import annotations

import collections
import warnings
from typing import Any, Callable

import numpy as np

from jaxloader.base import tree as tree_lib
from jaxloader.base.difference import MAPPING_SAID
from jaxloader.base.errors import CollateError, JaxloaderWarning, user_stacklevel

_TEXT = {"U": "str", "S": "bytes"}


class BatchKinds:
    """The first batch's leaves (their paths, dtypes and ranks), and the check of each batch
    after it against them (``check``: ~1 us a batch of a flat dict of 3 arrays)."""

    def __init__(self) -> None:
        self._keys: list | None = None  # the last batch that passed, if a flat dict: its keys,
        self._dtypes: list = []  # its leaves' dtypes and ranks (the fast path's)
        self._ranks: list = []
        self._first: dict[str, Any] | None = None  # the first batch's kinds, by leaf path
        self._skeleton: Any = None  # its structure's (_skeleton)
        self._treedef: tuple = (None, [], None)  # the last nested batch's, its paths, skeleton
        self._first_step = 0
        self._objects: list = []  # the last batch's object leaves' kinds (the fast path's)
        self._since: dict[str, int] = {}  # a leaf of objects first: the step that told its kind

    def check(self, batch: Any, step: int, where: Callable[[int], str]) -> None:
        """Raises ``CollateError`` if ``batch`` (of ``step``, which ``where`` names) has other
        leaves than the first batch checked, or another dtype or rank in one."""
        flat = type(batch) is dict
        if flat:
            try:
                dtypes = [v.dtype for v in batch.values()]
                ranks = [v.ndim for v in batch.values()]
            except AttributeError:  # (a nested dict, a leaf that is no array)
                flat = False
            else:
                objects = [_kind(v) for v, d in zip(batch.values(), dtypes) if d.kind == "O"]
                if dtypes == self._dtypes and ranks == self._ranks and list(batch) == self._keys \
                        and objects == self._objects:
                    return
        if flat:
            kinds = {f"[{k!r}]": _kind(v) for k, v in batch.items()}
            skeleton: Any = ("dict", frozenset((k, "leaf") for k in batch))
        else:
            leaves, treedef = tree_lib.flatten(batch)
            if treedef != self._treedef[0]:  # (its paths and skeleton: once a structure)
                self._treedef = (treedef, tree_lib.leaf_paths(treedef), _skeleton(treedef))
            _, paths, skeleton = self._treedef
            kinds = {path: _kind(leaf) for path, leaf in zip(paths, leaves)}
        if self._first is None:
            _sortable(batch, step, where)
            self._first, self._first_step, self._skeleton = kinds, step, skeleton
        elif kinds != self._first:
            self._compare(kinds, step, where)
        if skeleton != self._skeleton:  # (the same leaves in another structure)
            path, now, then = _first_difference(skeleton, self._skeleton)
            raise CollateError(
                f"{where(step)}: the batch's structure at {path or '<root>'} is {now}, where "
                f"the first batch, {where(self._first_step)}, had {then}: every batch must "
                "have one structure (a jitted step is compiled again for another, and a "
                "sharding written for the first no longer fits); make each record (or each "
                "BatchMap's batch) of one structure: one kind of container, the same keys, "
                "None in the same places")
        if flat:
            self._keys, self._dtypes, self._ranks, self._objects = (list(batch), dtypes, ranks,
                                                                    objects)

    def _compare(self, kinds: dict, step: int, where: Callable[[int], str]) -> None:
        first = self._first
        assert first is not None
        for path in {**first, **kinds}:  # (then: asked in a message only, a stream's replays)
            then = lambda: (f"the first batch, {where(self._first_step)}"  # noqa: E731
                            if path not in self._since else
                            f"the batch of step {self._since[path]} (the first to tell its kind)")
            if path not in kinds or path not in first:
                gone, new = ([p for p in a if p not in b][:5] for a, b in ((first, kinds),
                                                                           (kinds, first)))
                raise CollateError(
                    f"{where(step)}: batch leaf {path} is "
                    f"{'missing' if path not in kinds else 'new'} in this batch"
                    + (f" (missing: {', '.join(gone)}; new: {', '.join(new)})" if gone and new
                       else "") + f", against {then()}: every batch must have the same leaves; "
                    "make each record (or each BatchMap's batch) of one structure")
            now, before = kinds[path], first[path]
            if before is None and now is not None:  # (objects before: the first kind that
                first[path], self._since[path] = now, step  # tells is compared from here)
                continue
            if now is None or before is None or now == before:  # (objects: with anything)
                continue
            (kind, rank), (kind0, rank0) = now, before
            if kind == kind0:
                raise CollateError(
                    f"{where(step)}: batch leaf {path} is {rank}-D, where {then()}, had "
                    f"{rank0}-D: every batch must have one rank a leaf; reshape or pad it in a "
                    "Map (or the BatchMap that made it; records that all held an empty list [] "
                    "have an axis fewer: np.reshape(x, (-1, 4)) gives one the rows' shape)")
            name, name0 = (_TEXT.get(d.kind, d.name if d.isnative and d.names is None else
                                     str(d)) + ("" if r < 0 else f" ({r}-D)")
                           for d, r in ((kind, rank), (kind0, rank0)))  # (a byte order, a
            try:  # (numbers: the dtype that holds both)  # structure: not by its name alone)
                held = np.result_type(kind0, kind)  # (text by its kind: 'str672' is no dtype)
                fix = f"np.asarray(x, {_TEXT.get(held.kind, held.name)!r})"
            except TypeError:
                fix = f"np.asarray(x, {_TEXT.get(kind0.kind, kind0.name)!r})"
            if kind.names is not None or kind0.names is not None:
                fix = "a leaf a field: {f: x[f] for f in x.dtype.names}"
            cause = "a JSON number written 1 in some records and 1.5 in others, or parts of a " \
                "ConcatSource that differ"
            if np.dtype("float64") in (kind, kind0) and {kind.kind, kind0.kind} & set("iub"):
                cause += ("; or a Pad's batch whose records all held empty lists, float64 "
                          "for NumPy: give the Pad dtype= (jl.Pad(..., dtype=np.int32))")
            if {kind.kind, kind0.kind} == {"i", "u"} and fix.endswith("'float64')"):
                cause, fix = ("int64 and uint64 hold no common int, and float64 rounds past "
                              "2**53: 'uint64' if none is negative"), "np.asarray(x, 'uint64')"
            raise CollateError(
                f"{where(step)}: batch leaf {path} is {name}, where {then()}, had {name0}: every "
                f"batch must have one dtype a leaf ({cause}); make it one in a Map ({fix}), or "
                "in a jl.MapSource of the part that differs")


def _kind(leaf: Any) -> Any:
    """What is compared of a leaf: its dtype and rank; a text dtype by kind, whatever its
    width, and any rank, as Python strings or bytes (told by the first: a batch's records
    agree); ``None`` for other objects (compared with nothing)."""
    dtype = getattr(leaf, "dtype", None)
    if dtype is None:  # (a Python number, or an object)
        return (np.dtype(type(leaf)), 0) if isinstance(leaf, (bool, int, float)) else None
    if dtype.kind == "O":
        first = leaf.flat[0] if leaf.size else None
        return (np.dtype("U"), -1) if isinstance(first, str) else (
            (np.dtype("S"), -1) if isinstance(first, bytes) else None)
    if dtype.kind in _TEXT:
        return np.dtype(dtype.kind), -1
    return dtype, leaf.ndim


def _sortable(tree: Any, step: int, where: Callable[[int], str]) -> None:
    """Warns of a dict in the first batch whose keys cannot be sorted (an int key beside a str
    one): JAX sorts a dict's keys to flatten it (not an ``OrderedDict``'s), so
    ``jax.device_put``, ``jit`` and a sharding failed on it with JAX's bare "Comparator raised
    exception", far from the cause; NumPy batches are fine."""
    if (found := unsortable(tree)) is not None:
        warnings.warn(f"{where(step)}: the batch's {found}: jax.device_put, jit and shardings "
                      "fail on it; make them one type in a Map, str(key) for each",
                      JaxloaderWarning, stacklevel=user_stacklevel())


def unsortable(tree: Any, path: str = "") -> str | None:
    """The first dict in ``tree`` whose keys JAX cannot sort to flatten it, said ("dict at
    <path> has keys of int and str ([1, 'a']), which JAX cannot sort to flatten it"); None."""
    if isinstance(tree, dict):
        try:
            if not isinstance(tree, collections.OrderedDict):
                sorted(tree)
        except TypeError:
            kinds = sorted({type(k).__name__ for k in tree})
            return (f"dict at {path or '<root>'} has keys of {' and '.join(kinds)} "
                    f"({list(tree)[:6]}), which JAX cannot sort to flatten it")
        children: Any = ((f"{path}[{key!r}]", child) for key, child in tree.items())
    elif isinstance(tree, (list, tuple)):
        children = ((f"{path}[{i}]", child) for i, child in enumerate(tree))
    else:
        return None
    return next((found for at, child in children
                 if (found := unsortable(child, at)) is not None), None)


def _skeleton(treedef: tree_lib.TreeDef) -> Any:
    """What of a structure must stay from batch to batch: each node's kind (a tuple, not a
    list; one namedtuple or registered class, not another; ``None`` where it was), and a
    dict's keys in any order (JAX sorts them), each with its child's."""
    kind = treedef[0]
    if kind in ("leaf", "none"):
        return kind
    children = tuple(_skeleton(c) for c in treedef[-1])
    if kind in ("dict", "ordered", "defaultdict"):
        return kind, frozenset(zip(treedef[1], children))
    return (kind, *treedef[1:-1][:1], *([treedef[3]] if kind == "node" else []), children)


def _first_difference(now: Any, then: Any, path: str = "") -> tuple[str, str, str]:
    """Where skeletons ``now`` and ``then`` first differ, and what each has there."""
    def said(s: Any) -> str:
        if isinstance(s, str):
            return "None" if s == "none" else "a leaf"
        kind = s[0]
        if kind in MAPPING_SAID:
            return f"{MAPPING_SAID[kind]} of keys [{', '.join(sorted(repr(k) for k, _ in s[1]))}]"
        if kind in ("namedtuple", "node"):
            return f"a {s[1].__name__}"
        return f"a {kind} of {len(s[-1])}"
    if isinstance(now, str) or isinstance(then, str) or now[0] != then[0] or now[1:-1] != then[
            1:-1] and now[0] not in ("dict", "ordered", "defaultdict"):
        return path, said(now), said(then)
    if now[0] in ("dict", "ordered", "defaultdict"):
        a, b = dict(now[1]), dict(then[1])
        if a.keys() != b.keys():
            return path, said(now), said(then)
        for key in a:
            if a[key] != b[key]:
                return _first_difference(a[key], b[key], f"{path}[{key!r}]")
    for i, (x, y) in enumerate(zip(now[-1], then[-1])):
        if x != y:
            return _first_difference(x, y, f"{path}[{i}]")
    return path, said(now), said(then)
