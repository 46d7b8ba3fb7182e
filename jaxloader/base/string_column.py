"""A batch's strings (or bytes) as one buffer: how a file source's text reaches the main process.

::

    row groups' columns ──rows_of()──> Rows: Arrow's layout (the rows' bytes, one after the
                                       other, and where each starts), checked for NULs
    rows of a batch ──gather()──> StringColumn: those rows, each followed by a NUL (NumPy calls,
                                  none a row)
        in a worker: written into the slot after the numbers (one copy), its size beside
        in the main process: one decode and one split (C) ──> an object array of ``str``

Otherwise a batch's strings travel one Python object at a time: sliced in the worker, pickled,
unpickled, hundreds of Python calls a batch on each side.
A row that holds a NUL cannot be split on it: ``rows_of`` gives ``None`` for such a column
(and the caller for text that is not UTF-8, which must raise at its row), and the source reads
those rows as Python objects. The NULs are put in as a batch is gathered, not into
a row group's copy, which each worker would make again for each window.

Example:
    >>> data = np.frombuffer("abcdé".encode(), np.uint8)  # rows "a", "bc", "dé" (é: 2 bytes)
    >>> rows = rows_of([(data, np.array([0, 1, 3, 6]))], text=True)
    >>> column = gather(rows, np.array([2, 0]))
    >>> column.objects().tolist(), len(column)
    (['dé', 'a'], 2)
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

_EMPTY = np.zeros(0, np.uint8)
_OBJECT = np.dtype(object)


class Rows(NamedTuple):
    """Rows in one buffer, as Arrow keeps them: row ``r`` is ``data[starts[r]:starts[r + 1]]``,
    and no row holds a NUL."""

    data: np.ndarray  # uint8
    starts: np.ndarray  # int64, one more than the rows (the end last), from 0
    text: bool  # str rows (UTF-8), else bytes

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + self.starts.nbytes)


class StringColumn(NamedTuple):
    """``size`` rows of a batch, each followed by a NUL, in ``data`` (see the module)."""

    data: np.ndarray  # uint8
    size: int  # rows
    text: bool
    ends: np.ndarray | None = None  # where each row's NUL ends, for ``rows`` (gather's)

    def __len__(self) -> int:
        return self.size

    def span(self, a: int, b: int) -> tuple[int, int]:
        """Where rows ``a`` to ``b`` (not included) and their NULs are in ``data``."""
        ends = self.ends
        assert ends is not None  # made by gather
        return (int(ends[a - 1]) if a else 0), (int(ends[b - 1]) if b else 0)

    def rows(self, a: int, b: int) -> "StringColumn":
        """Rows ``a`` to ``b`` (not included), sharing ``data``."""
        start, stop = self.span(a, b)
        return StringColumn(self.data[start:stop], b - a, self.text)

    def objects(self) -> np.ndarray:
        """The rows as a 1-D object array of ``str`` (or ``bytes``)."""
        return split(self.data, self.size, self.text)


def rows_of(parts: Sequence[tuple[np.ndarray, np.ndarray]], text: bool) -> Rows | None:
    """The rows of ``parts``, one after the other, as one ``Rows``; ``None`` if a row holds a
    NUL. A part is a row group's bytes and offsets as Arrow keeps them (row ``r`` is
    ``data[offsets[r]:offsets[r + 1]]``, offsets from any first value, 32 or 64 bits;
    ``text``: UTF-8, as the caller checked). One part's bytes are a view of ``data``; several
    are copied once into one buffer, and their offsets written once into one array."""
    used = [(data[int(offsets[0]):int(offsets[-1])], offsets) for data, offsets in parts]
    joined = used[0][0] if len(used) == 1 else np.concatenate([u for u, _ in used])
    if joined.size and not joined.all():
        return None
    starts = np.empty(sum(len(o) - 1 for _, o in used) + 1, np.int64)
    row = at = 0
    for data, offsets in used:  # each part's offsets shifted to where its bytes are now
        np.subtract(offsets[:-1], int(offsets[0]) - at, out=starts[row:row + len(offsets) - 1],
                    dtype=np.int64)
        row, at = row + len(offsets) - 1, at + len(data)
    starts[-1] = at
    return Rows(joined, starts, text)


def gather(rows: Rows, at: np.ndarray) -> StringColumn:
    """Rows ``at`` of ``rows``, in that order, each followed by a NUL."""
    if not len(at):
        return StringColumn(_EMPTY, 0, rows.text)
    starts = rows.starts[at]
    sized = rows.starts[at + 1] - starts + 1  # each row and its NUL
    ends = np.cumsum(sized)
    total = int(ends[-1])
    # byte k of the output is byte k + (start of its row - where its row starts here); a NUL's
    # is the byte after its row (past the end for the last row: clipped), then overwritten
    shift = np.repeat(starts - (ends - sized), sized)
    shift += np.arange(total)
    out = rows.data.take(shift, mode="clip") if len(rows.data) else np.empty(total, np.uint8)
    out[ends - 1] = 0
    return StringColumn(out, len(at), rows.text, ends)


def split(data: np.ndarray | memoryview, count: int, text: bool) -> np.ndarray:
    """``count`` rows of ``data`` (each followed by a NUL) as a 1-D object array."""
    if not count:
        return np.empty(0, dtype=object)
    raw: Any = data[:-1]  # a buffer (NumPy's stubs for Python 3.11 do not say so)
    rows = str(raw, "utf-8").split("\0") if text else bytes(raw).split(b"\0")
    # filled as NumPy unpickles an object array: no look at each row for an array inside it,
    # as ``out[:] = rows`` does (256 rows: 4.6 against 7.8 us, a third of the main process's
    # cost of a batch's strings after the split itself)
    out = np.empty(0, dtype=object)
    state: Any = (1, (count,), _OBJECT, False, rows)  # (version, shape, dtype, Fortran, data)
    out.__setstate__(state)
    return out

