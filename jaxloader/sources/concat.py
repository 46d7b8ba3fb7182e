"""``ConcatSource``: several sources one after another, as one index space.

Index ``i`` is record ``i - offsets[k]`` of source ``k``, where ``offsets`` are the cumulative
lengths: a pure function of the index, so shuffling, resuming and worker counts work across the
parts as over one source.

Example:
    >>> import numpy as np
    >>> from jaxloader.sources.arrays import ArraySource
    >>> both = ConcatSource([ArraySource({"x": np.arange(3)}), ArraySource({"x": np.arange(10, 12)})])
    >>> len(both), int(both[3]["x"]), both.locate(np.array([0, 4])).tolist()
    (5, 10, [[0, 0], [1, 1]])
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxloader.errors import ConfigError
from jaxloader.sources.base import check_source


class ConcatSource:
    """``sources[0]``'s records, then ``sources[1]``'s, and so on."""

    def __init__(self, sources: Sequence[Any]) -> None:
        if isinstance(sources, (str, bytes)) or not len(sources):
            raise ConfigError(
                f"ConcatSource(sources): expected a non-empty list of sources, got {sources!r:.80}"
            )
        lengths = []
        for k, source in enumerate(sources):
            try:
                lengths.append(check_source(source))
            except ConfigError as e:
                raise ConfigError(f"ConcatSource: sources[{k}]: {e}") from None
        self.sources = list(sources)
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, indices: np.ndarray) -> np.ndarray:
        """``[source number, index in it]`` for each index (a ``(n, 2)`` array)."""
        parts = np.searchsorted(self.offsets, indices, side="right") - 1
        return np.stack([parts, indices - self.offsets[parts]], axis=-1)

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < len(self):
            raise IndexError(f"ConcatSource: index {index} out of range [0, {len(self)})")
        part = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return self.sources[part][int(index - self.offsets[part])]

    def __repr__(self) -> str:
        return f"ConcatSource({len(self)} records in {len(self.sources)} sources)"
