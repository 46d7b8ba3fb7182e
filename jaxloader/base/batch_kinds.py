"""Every batch a loader hands out has the leaves, dtypes and ranks of its first.

A batch is collated from its own records, which must agree with each other; nothing made two
batches agree. A JSON number written ``1`` in one record and ``1.5`` in the next made an int64
batch and a float64 one (with a batch size of 2; ``CollateError`` with 4, where both met), a
``ConcatSource``'s parts of other dtypes made batches of each in turn, and a ``BatchMap`` could
return another structure for some steps: the training step was compiled again, or failed far
from the cause. Strings and other objects are compared by kind (a batch of longer strings has a
wider ``<U`` dtype); shapes by rank (a ``BatchMap`` may pad to each batch's longest).

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

from typing import Any, Callable

import numpy as np

from jaxloader.base import tree as tree_lib
from jaxloader.base.errors import CollateError


class BatchKinds:
    """The first batch's leaves (their paths, dtypes and ranks), and the check of each batch
    after it against them (``check``: ~1 us a batch of a flat dict of 3 arrays)."""

    def __init__(self) -> None:
        # the first batch's (keys of a flat dict, or leaf paths; (dtype char, rank) a leaf)
        self._first: tuple[list, list] | None = None
        self._first_step = 0
        self._names: dict[str, tuple[str, int]] = {}  # its leaves' dtypes by name, and ranks

    def check(self, batch: Any, step: int, where: Callable[[int], str]) -> None:
        """Raises ``CollateError`` if ``batch`` (of ``step``, which ``where`` names) has other
        leaves than the first batch checked, or another dtype or rank in one."""
        if type(batch) is dict:
            try:  # (a flat dict of arrays: no tree walk; a char a dtype, "U" whatever width)
                found = list(batch), [(v.dtype.char, v.ndim) for v in batch.values()]
            except AttributeError:  # (a nested dict, a leaf that is no array)
                found = _leaves(batch)
        else:
            found = _leaves(batch)
        if found == self._first:
            return
        if self._first is None:
            self._first, self._first_step, self._names = found, step, _named(batch)
            return
        named = _named(batch)
        if named != self._names:  # (a nested dict against a flat one alike: none differ)
            self._refuse(named, step, where)

    def _refuse(self, named: dict, step: int, where: Callable[[int], str]) -> None:
        first = self._names
        then = f"the first batch (step {self._first_step})"
        for path in {**first, **named}:
            if path not in named or path not in first:
                raise CollateError(
                    f"{where(step)}: batch leaf {path} is "
                    f"{'missing' if path not in named else 'new'} in this batch, against "
                    f"{then}: every batch must have the same leaves; make each record (or "
                    "each BatchMap's batch) of one structure")
            if named[path] != first[path]:
                (kind, rank), (kind0, rank0) = named[path], first[path]
                try:  # (numbers: the dtype that holds both)
                    common = np.result_type(np.dtype(kind0), np.dtype(kind)).name
                except TypeError:
                    common = kind0
                raise CollateError(
                    f"{where(step)}: batch leaf {path} is {kind} ({rank}-D), where {then} had "
                    f"{kind0} ({rank0}-D): every batch must have one dtype and rank a leaf (a "
                    f"JSON number written 1 in some records and 1.5 in others, or parts of a "
                    f"ConcatSource that differ); make it one in a Map (np.asarray(x, "
                    f"np.{common})), or in a jl.MapSource of the part that differs")


def _leaves(batch: Any) -> tuple[list, list]:
    """Any batch's leaf paths and (dtype char, rank) a leaf."""
    leaves, treedef = tree_lib.flatten(batch)
    return tree_lib.leaf_paths(treedef), [_char(leaf) for leaf in leaves]


def _char(leaf: Any) -> tuple[str, int]:
    dtype = getattr(leaf, "dtype", None)
    return (type(leaf).__name__ if dtype is None else dtype.char,
            len(getattr(leaf, "shape", ())))


def _named(batch: Any) -> dict[str, tuple[str, int]]:
    """Each leaf's path: its dtype's name (a kind for strings and objects), and its rank."""
    leaves, treedef = tree_lib.flatten(batch)
    out = {}
    for path, leaf in zip(tree_lib.leaf_paths(treedef), leaves):
        dtype = getattr(leaf, "dtype", None)
        kind = (type(leaf).__name__ if dtype is None else
                {"U": "str", "S": "bytes", "O": "object"}.get(dtype.kind, dtype.name))
        out[path] = (kind, len(getattr(leaf, "shape", ())))
    return out
