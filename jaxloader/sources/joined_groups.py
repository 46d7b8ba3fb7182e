"""Row groups joined into one table, so that a batch reading from several is one take a column.

::

    a batch's rows ──(their row groups)──> all in the join? ──> rows of the join
        ──take──>   each column of numbers          (one NumPy call, rows in batch order)
        ──gather──> each column of strings or bytes (a StringColumn: jaxloader.base.string_column)

A read-local batch reads from every row group of its window (8 by default). Row group by row
group, it is a run each, a few NumPy calls a run and column, its strings sliced one by one, and
the rows put back in order after, where a join is one take a column. ``ParquetSource`` joins the row
groups of a batch whose rows are not all in its join: once a window in a read-local order (its
batches read the same row groups, and a batch across two windows joins both, which the next
window's batches then find there), once a row group in file order. One row group is its own
join, its numbers not copied.

A join can be made of columns of numbers (NumPy arrays of one shape a row, not of objects) and
of strings or bytes without a NUL; ``JoinedGroups.of`` gives ``None`` for any other column
(structs, ragged lists, decimals), which is read run by run.

Example:
    >>> starts = np.array([0, 2, 5])                  # two row groups: rows 0-1 and 2-4
    >>> joined = JoinedGroups.of(np.array([0, 1]), [{"x": np.array([10, 11])},
    ...                                             {"x": np.array([12, 13, 14])}], starts)
    >>> rows = joined.rows(np.array([4, 0]), np.array([1, 0]))
    >>> joined.gather(rows)["x"].tolist()
    [14, 10]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxloader.base import string_column
from jaxloader.base.columns import DeferredTake
from jaxloader.sources.arrow_columns import ArrowRows

_ABSENT = np.iinfo(np.int64).min // 2  # a row group not joined: its rows come out negative


class JoinedGroups:
    """The rows of some row groups as one table (see the module docstring)."""

    def __init__(self, columns: dict[str, Any], offsets: np.ndarray, nbytes: int) -> None:
        self._columns = columns
        self._offsets = offsets  # a row group's first row in the join, less its first row
        self.nbytes = nbytes

    @classmethod
    def of(cls, groups: np.ndarray, decoded: list[dict[str, Any]],
           starts: np.ndarray) -> "JoinedGroups | None":
        """The join of row groups ``groups`` (distinct, ascending), decoded as ``decoded``;
        ``starts``: where each row group of the source starts (its row count last)."""
        columns: dict[str, Any] = {}
        for name in decoded[0]:
            parts = [d[name] for d in decoded]
            if all(type(p) is np.ndarray and not p.dtype.hasobject for p in parts):
                if len({p.shape[1:] for p in parts}) != 1:
                    return None  # lists of one length in a row group, another in the next
                columns[name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
            elif all(type(p) is ArrowRows for p in parts):
                buffers = [p.buffer_part() for p in parts]
                if any(b is None for b in buffers):
                    return None
                rows = string_column.rows_of(buffers, parts[0].text)
                if rows is None:  # a row holds a NUL
                    return None
                columns[name] = rows
            else:
                return None
        offsets = np.full(len(starts) - 1, _ABSENT, np.int64)
        sizes = starts[groups + 1] - starts[groups]
        offsets[groups] = np.cumsum(sizes) - sizes - starts[groups]
        return cls(columns, offsets, sum(int(c.nbytes) for c in columns.values()))

    def rows(self, indices: np.ndarray, groups: np.ndarray) -> np.ndarray | None:
        """The rows of the join that the source's ``indices`` (in row groups ``groups``) are,
        or ``None`` if one is in a row group not joined."""
        rows = indices + self._offsets[groups]
        return rows if not len(rows) or rows.min() >= 0 else None

    def gather(self, rows: np.ndarray, lazy: bool = False) -> dict[str, Any]:
        """Each column's ``rows``: arrays (``lazy``: ``columns.DeferredTake``s, gathered where they
        are written, a worker's slot), and ``StringColumn`` for strings and bytes."""
        return {name: (DeferredTake(column, rows) if lazy else column.take(rows, axis=0))
                if type(column) is np.ndarray else string_column.gather(column, rows)
                for name, column in self._columns.items()}
