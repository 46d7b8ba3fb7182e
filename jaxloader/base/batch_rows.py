"""A source's batch (what ``__getitems__`` or a batched ``MapSource``'s function returns) split
into its records, for the transforms that take records one by one: each leaf checked to hold a
row a record first. A leaf that did not (a list of rows, a pytree node in a batch; a string; a
row too many) was split anyway: records of other records' rows, a caption's characters, the
last row dropped, without a word, where the same batch without transforms is refused.

Example:
    >>> import numpy as np
    >>> split_rows({"x": np.arange(4).reshape(2, 2)}, 2)
    [{'x': array([0, 1])}, {'x': array([2, 3])}]
"""

from __future__ import annotations

from typing import Any

from jaxloader.base import tree as tree_lib
from jaxloader.base.errors import CollateError


def split_rows(batched: Any, n: int) -> list:
    """A batched tree (leaves with ``n`` rows) as ``n`` trees of one row each; a
    ``CollateError`` naming the first leaf that does not hold ``n`` rows along axis 0."""
    leaves, treedef = tree_lib.flatten(batched)
    for k, leaf in enumerate(leaves):
        shape = getattr(leaf, "shape", None)
        if not isinstance(shape, tuple) or not shape or shape[0] != n or isinstance(
                leaf, (str, bytes)):  # (torch's Size is a tuple)
            path = tree_lib.leaf_paths(treedef)[k]
            listed = path.endswith("]") and path.rsplit("[", 1)[1][:-1].isdigit()
            got = f"shape {shape}" if isinstance(shape, tuple) else f"a {type(leaf).__name__}"
            raise CollateError(
                f"batch leaf {path}: expected {n} rows (a row a record asked for) along axis "
                f"0 of the source's batch, got {got}; __getitems__ (or a batched MapSource's "
                "function) returns a batch whose every leaf holds a row a record"
                + ("; a list or tuple in a batch is a pytree node, not a column: give a column "
                   "of rows as an array (np.asarray(rows), dtype=object for strings or rows of "
                   "other lengths), or return a list of records" if listed else ""))
    return [tree_lib.unflatten(treedef, [leaf[j] for leaf in leaves]) for j in range(n)]
