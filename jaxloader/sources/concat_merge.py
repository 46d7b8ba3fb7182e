"""A batch of a ``ConcatSource`` from its parts' answers (``merged``): their rows put back in
the order asked for, leaf by leaf, a dtype the parts' columns share (ints and floats promoted,
text of any width), or a ``CollateError`` naming the parts that differ.

Example:
    >>> import numpy as np
    >>> pieces = [(np.array([1]), {"x": np.array([5])}), (np.array([0]), {"x": np.array([7])})]
    >>> merged(pieces, 2, lambda i: f"sources[{i}]")["x"].tolist()
    [7, 5]
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from jaxloader.base import tree as tree_lib
from jaxloader.base.errors import CollateError


def merged(pieces: list, n: int, label: Callable[[int], str]) -> Any:
    """Batched answers of the parts, rows put back in the order asked for; ``label(i)``:
    the part of ``pieces[i]``, as messages name it."""
    if len(pieces) == 1:
        return pieces[0][1]  # one part, read in the order asked for
    flat = _merge_flat(pieces, n)
    if flat is not None:
        return flat
    treedef = tree_lib.flatten(pieces[0][1])[1]
    paths = tree_lib.leaf_paths(treedef)
    answers = []
    for i, (run, got) in enumerate(pieces):
        leaves, other = tree_lib.flatten(got)
        if other != treedef:
            raise CollateError(
                "the parts of a ConcatSource (a jl.mix's components are its parts) differ in "
                f"structure: {tree_lib.describe(treedef)} in {label(0)}, "
                f"{tree_lib.describe(other)} in {label(i)}; make the parts' records alike: "
                "rename or add keys with a "
                "jl.MapSource(part, fn) of the part that differs (a Map on the loader cannot: "
                "parts are read together)"
            )
        answers.append([np.asarray(leaf) for leaf in leaves])
    outs = []
    for i, path in enumerate(paths):
        columns = [leaves[i] for leaves in answers]
        out = np.empty((n, *columns[0].shape[1:]), _merged_dtype(path, columns, label))
        for (run, _), column in zip(pieces, columns):
            out[run] = column
        outs.append(out)
    return tree_lib.unflatten(treedef, outs)


def _merged_dtype(path: str, columns: list[np.ndarray],
                  label: Callable[[int], str]) -> np.dtype:
    """The dtype the parts' columns of one leaf merge into: theirs where they agree. Strings
    of other widths take the widest (``<U3`` and ``<U5``: ``<U5``), and fixed-width strings
    with a part's Python ones (a Parquet column) become Python ones (``object``), as a
    record's strings batch; any other difference is named."""
    first = columns[0]
    if all(c.dtype == first.dtype and c.shape[1:] == first.shape[1:] for c in columns) and (
            first.dtype != object or len({_text_kind(c) for c in columns} - {"empty"}) < 2):
        return first.dtype  # (objects: one part's str beside another's bytes differ)
    kinds = {_text_kind(c) for c in columns} - {"empty"}
    if len(kinds) == 1 and None not in kinds and all(
            c.shape[1:] == first.shape[1:] for c in columns):
        if any(c.dtype == object for c in columns):
            return np.dtype(object)
        return np.result_type(*(c.dtype for c in columns))
    i, other = next((i, c) for i, c in enumerate(columns)
                    if c.dtype != first.dtype or c.shape[1:] != first.shape[1:]
                    or _text_kind(c) not in (_text_kind(first), "empty"))
    raise CollateError(
        f"batch leaf {path}: the parts of a ConcatSource differ (a jl.mix's "
        "components are its parts): "
        f"{_said(first)} in {label(0)}, {_said(other)} in "
        f"{label(i)}; make the parts' records alike: " + (
            "cast with a jl.MapSource(part, fn) of the part that differs" if other.shape[1:] ==
            first.shape[1:] else "their shapes differ past the batch's axis: pad or crop them "
            "to one in a jl.MapSource(part, fn) of the part that differs (PackedSources of "
            "other lengths: pack them at one length, or read each length with a loader of its "
            "own, one after the other: a curriculum's phases)")
        + " (a Map on the loader cannot: parts are read together)"
    )


def _said(column: np.ndarray) -> str:
    """A part's column for a message: its dtype and row shape, and an object one's text kind."""
    kind = {"U": " of str", "S": " of bytes"}.get(_text_kind(column) or "", "")
    return f"{column.dtype}{column.shape[1:]}" + (kind if column.dtype == object else "")


def _first_type(column: np.ndarray) -> type | None:
    """The type of an object column's first value that is not ``None`` (``None``: none)."""
    return next((type(v) for v in column.flat if v is not None), None)


def _text_kind(column: np.ndarray) -> str | None:
    """``"U"`` for a column of ``str`` (fixed width, or Python objects, nulls among them),
    ``"S"`` for one of ``bytes``, ``"empty"`` for an object column of no rows or nulls alone,
    ``None`` for anything else."""
    if column.dtype.kind in "US":
        return column.dtype.kind
    if column.dtype != object:
        return None
    if not column.size or all(v is None for v in column.flat):  # (a null: any kind's)
        return "empty"
    if all(isinstance(v, str) or v is None for v in column.flat):
        return "U"
    if all(isinstance(v, bytes) or v is None for v in column.flat):
        return "S"
    return None


def _merge_flat(pieces: list, n: int) -> dict | None:
    """``merged`` of dicts of arrays with the same keys, dtypes and row shapes (a file
    source's batches): with no pytree walk (~60 us a batch of 3 parts under cProfile, from 250);
    ``None`` for any other answer, which ``merged`` then merges or names."""
    first = pieces[0][1]
    if type(first) is not dict:
        return None
    for _, got in pieces:
        if type(got) is not dict or got.keys() != first.keys() or not all(
                type(v) is np.ndarray and v.dtype == first[k].dtype
                and v.shape[1:] == first[k].shape[1:] for k, v in got.items()):
            return None
    if any(v.dtype == object and len({_first_type(got[k]) for _, got in pieces} - {None}) > 1
           for k, v in first.items()):  # (a part's str beside another's bytes: named below)
        return None
    out = {}
    for key, column in first.items():
        merged = np.empty((n, *column.shape[1:]), column.dtype)
        for run, got in pieces:
            merged[run] = got[key]
        out[key] = merged
    return out
