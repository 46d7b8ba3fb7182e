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
    after it against them (``check``: ~0.5 us a batch of a flat dict of arrays)."""

    def __init__(self) -> None:
        self._keys: list | None = None  # a flat dict batch's keys, and its leaves' dtypes
        self._dtypes: list = []
        self._first: tuple[int, dict[str, tuple[str, int]]] | None = None  # (step, by path)

    def check(self, batch: Any, step: int, where: Callable[[int], str]) -> None:
        """Raises ``CollateError`` if ``batch`` (of ``step``, which ``where`` names) has other
        leaves than the first batch checked, or another dtype or rank in one."""
        if type(batch) is dict and self._keys is not None:
            try:
                if [v.dtype for v in batch.values()] == self._dtypes and list(batch) == \
                        self._keys:
                    return
            except AttributeError:  # (a nested dict)
                pass
        kinds = _kinds(batch)
        if self._first is None:
            self._first = (step, kinds)
        elif kinds != self._first[1]:
            self._refuse(kinds, step, where)
        if type(batch) is dict and all(hasattr(v, "dtype") for v in batch.values()):
            self._keys, self._dtypes = list(batch), [v.dtype for v in batch.values()]

    def _refuse(self, kinds: dict, step: int, where: Callable[[int], str]) -> None:
        first_step, first = self._first  # type: ignore[misc]
        then = f"the first batch (step {first_step})"
        for path in {**first, **kinds}:
            if path not in kinds or path not in first:
                raise CollateError(
                    f"{where(step)}: batch leaf {path} is {'missing' if path not in kinds else 'new'}"
                    f" in this batch, against {then}: every batch must have the same leaves; "
                    f"make each record (or each BatchMap's batch) of one structure")
            if kinds[path] != first[path]:
                (kind, rank), (kind0, rank0) = kinds[path], first[path]
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


def _kinds(batch: Any) -> dict[str, tuple[str, int]]:
    """Each leaf's path: its dtype's name (a kind for strings and objects), and its rank."""
    leaves, treedef = tree_lib.flatten(batch)
    out = {}
    for path, leaf in zip(tree_lib.leaf_paths(treedef), leaves):
        dtype = getattr(leaf, "dtype", None)
        kind = (type(leaf).__name__ if dtype is None else
                {"U": "str", "S": "bytes", "O": "object"}.get(dtype.kind, str(dtype)))
        out[path] = (kind, len(getattr(leaf, "shape", ())))
    return out
