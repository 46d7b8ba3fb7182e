"""The source protocol: anything with ``__len__`` and ``__getitem__``.

A source maps an index in ``[0, len)`` to a record (a pytree of arrays and scalars). Hugging Face
datasets, Grain sources and PyTorch map-style datasets are sources by duck typing. A source may
also offer ``__getitems__(indices)`` for a vectorised read of many records at once; it returns
either a ``list`` of records (PyTorch's and Hugging Face's convention) or an already batched
pytree (any other container) whose leaves have ``len(indices)`` rows. The loader uses it when no
per-record transform needs single records. A source may give a ``fingerprint`` (a str) that
changes when its data does (``jaxloader.fingerprint``).

Example:
    >>> check_source([{"x": 1}, {"x": 2}])
    2
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from jaxloader.errors import ConfigError


@runtime_checkable
class Source(Protocol):
    """The source protocol: a length and random access by integer index."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


def check_source(source: Any) -> int:
    """Checks the source protocol; returns ``len(source)``."""
    if isinstance(source, Mapping):
        raise ConfigError(
            f"source: got a {type(source).__name__} of {len(source)} entries "
            f"({', '.join(map(repr, list(source)[:4]))}), which would be read as "
            f"{len(source)} records; for arrays with the records along axis 0, wrap it: "
            "jaxloader.ArraySource(your_dict)"
        )
    if not isinstance(source, Source):
        raise ConfigError(
            f"source: expected an object with __len__ and __getitem__ (a random-access source), "
            f"got {type(source).__name__}; wrap NumPy arrays as ArraySource(arrays)"
        )
    n = len(source)
    if n <= 0:
        raise ConfigError(
            f"source: expected at least one record, got an empty source ({type(source).__name__} "
            "of length 0); check the path or the split you loaded"
        )
    return n
