"""``Source`` and ``BatchedSource``: the source protocol (``sources.base`` says what a source
is), in a module of its own that imports nothing of jaxloader's: every source class names it
as its base (``class ArraySource(Source)``), and ``sources.base``, which reads sources, imports
some of them.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Source(Protocol):
    """The source protocol: a length and random access by integer index. jaxloader's sources
    subclass it, so that a list of several kinds is a ``list[Source]`` to a type checker.

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> class Squares:  # any such object is a source
        ...     def __len__(self):
        ...         return 10
        ...     def __getitem__(self, index):
        ...         return {"x": np.int64(index * index)}
        >>> isinstance(Squares(), jl.Source)
        True
        >>> loader = jl.DataLoader(Squares(), batch_size=5, process_index=0, process_count=1)
        >>> next(iter(loader))["x"].tolist()
        [0, 1, 4, 9, 16]
    """

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> Any: ...  # (positional: any name fits, ``idx``)


@runtime_checkable
class BatchedSource(Source, Protocol):
    """A source that also reads many records at once: ``__getitems__(indices)`` gives a list of
    records or an already batched pytree (see above)."""

    def __getitems__(self, indices: np.ndarray) -> Any: ...
