"""Hugging Face ``datasets.Dataset``, passed to the loader as it is, read as NumPy.

In its default (Python) format a ``Dataset`` returns list features as Python lists, which are
pytree nodes: a 32-float feature would batch as 32 arrays of shape ``(batch,)``. The loader
therefore reads a ``Dataset`` through ``HuggingFaceSource``: the same columns in NumPy format,
so a numeric list feature is one array (``(batch, 32)``), and strings stay ``str`` (an object
leaf, whatever their lengths) in either format. Batches are read with one vectorised call, and
the dataset's own fingerprint (it changes with every ``map``/``filter``) guards restores.
``datasets`` is not a dependency: a ``Dataset`` is recognised by its module.

Example (``tests/sources/test_huggingface.py`` runs it)::

    ds = datasets.Dataset.from_dict({"v": [[0.0, 1.0]] * 4, "t": ["a", "bb", "c", "d"]})
    batch = next(iter(jl.DataLoader(ds, batch_size=2)))
    batch["v"].shape, batch["t"].tolist()   # ((2, 2), ['a', 'bb'])
"""

from __future__ import annotations

from typing import Any

import numpy as np


def adapt(source: Any) -> Any:
    """``HuggingFaceSource(source)`` for a ``datasets.Dataset``, the source itself otherwise."""
    if type(source).__module__.startswith("datasets.") and hasattr(source, "with_format"):
        return HuggingFaceSource(source)
    return source


class HuggingFaceSource:
    """A ``datasets.Dataset`` (any format) read in NumPy format, strings as ``str``."""

    def __init__(self, dataset: Any) -> None:
        fmt = dataset.format
        self.dataset = dataset.with_format(
            "numpy", columns=fmt["columns"], output_all_columns=fmt["output_all_columns"])
        self.fingerprint = str(getattr(dataset, "_fingerprint", "")) or None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[int(index)]

    def __getitems__(self, indices: np.ndarray) -> Any:
        batch = self.dataset[np.asarray(indices).tolist()]
        return {key: _strings_as_objects(value) for key, value in batch.items()}

    def __repr__(self) -> str:
        return f"HuggingFaceSource({self.dataset!r:.200})"


def _strings_as_objects(column: Any) -> Any:
    """NumPy's fixed-width strings (padded to the longest) as an object array of ``str``."""
    if isinstance(column, np.ndarray) and column.dtype.kind in "US":
        out = np.empty(column.shape, dtype=object)
        out[...] = column.tolist()
        return out
    return column
