"""A batch's strings (or bytes) as one buffer: how a file source's text reaches the main process.

::

    a row group's column ──separate()──> Separated: its rows in one buffer, a NUL after each
    rows of a batch ──gather()──> StringColumn: those rows, each followed by a NUL (NumPy calls,
                                  none a row)
        in a worker: written into the slot after the numbers (one copy), its size beside
        in the main process: one decode and one split (C) ──> an object array of ``str``

Otherwise a batch's strings travel one Python object at a time: sliced in the worker, pickled,
unpickled, hundreds of Python calls a batch on each side (a 256-row batch of short strings:
~350 us of a worker's CPU and ~85 us of the main process's, measured in docs/benchmarks.md).
A row that holds a NUL cannot be split on it: ``separate`` gives ``None`` for such a column
(and for text that is not UTF-8, which must raise at its row), and the source reads those rows
as Python objects, as before.

Example:
    >>> data = np.frombuffer("abcdé".encode(), np.uint8)  # rows "a", "bc", "dé" (é: 2 bytes)
    >>> rows = separate(data, np.array([0, 1, 3, 6]), text=True)
    >>> column = gather(rows, np.array([2, 0]))
    >>> column.objects().tolist(), len(column)
    (['dé', 'a'], 2)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

_EMPTY = np.zeros(0, np.uint8)


class Separated(NamedTuple):
    """Rows in one buffer: row ``r`` is ``data[starts[r]:starts[r + 1] - 1]``, then a NUL."""

    data: np.ndarray  # uint8
    starts: np.ndarray  # int64, one more than the rows (the end last)
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

    def rows(self, a: int, b: int) -> "StringColumn":
        """Rows ``a`` to ``b`` (not included), sharing ``data``."""
        ends = self.ends
        assert ends is not None  # made by gather
        start, stop = (int(ends[a - 1]) if a else 0), (int(ends[b - 1]) if b else 0)
        return StringColumn(self.data[start:stop], b - a, self.text)

    def objects(self) -> np.ndarray:
        """The rows as a 1-D object array of ``str`` (or ``bytes``)."""
        return split(self.data, self.size, self.text)


def separate(data: np.ndarray, offsets: np.ndarray, text: bool) -> Separated | None:
    """Rows ``data[offsets[r]:offsets[r + 1]]`` (offsets as Arrow keeps them, from any
    first value; ``text``: UTF-8, as the caller checked) with a NUL after each; ``None`` if a
    row holds a NUL."""
    first, last = int(offsets[0]), int(offsets[-1])
    used = data[first:last]
    if used.size and not used.all():
        return None
    rows = len(offsets) - 1
    starts = offsets.astype(np.int64) - first
    out = np.empty(last - first + rows, np.uint8)
    ends = starts[1:] + np.arange(rows)  # where each row's NUL goes, past the NULs before it
    keep = np.ones(len(out), bool)
    keep[ends] = False
    out[keep] = used
    out[ends] = 0
    starts += np.arange(rows + 1)
    return Separated(out, starts, text)


def join(parts: list[Separated]) -> Separated:
    """The rows of ``parts``, one after the other, as one ``Separated``."""
    if len(parts) == 1:
        return parts[0]
    data = np.concatenate([p.data for p in parts])
    shifts = np.cumsum([0] + [len(p.data) for p in parts[:-1]])
    starts = np.concatenate([p.starts[:-1] + s for p, s in zip(parts, shifts)]
                            + [np.array([len(data)], np.int64)])
    return Separated(data, starts, parts[0].text)


def gather(rows: Separated, at: np.ndarray) -> StringColumn:
    """Rows ``at`` of ``rows``, in that order."""
    if not len(at):
        return StringColumn(_EMPTY, 0, rows.text)
    starts = rows.starts[at]
    lengths = rows.starts[at + 1] - starts  # each with its NUL
    ends = np.cumsum(lengths)
    # byte k of the output is byte k + (start of its row - where its row starts here)
    shift = np.repeat(starts - (ends - lengths), lengths)
    shift += np.arange(int(ends[-1]))
    return StringColumn(rows.data.take(shift), len(at), rows.text, ends)


def split(data: np.ndarray | memoryview, count: int, text: bool) -> np.ndarray:
    """``count`` rows of ``data`` (each followed by a NUL) as a 1-D object array."""
    out = np.empty(count, dtype=object)
    if count:
        raw = bytes(data[:-1])
        out[:] = raw.decode("utf-8").split("\0") if text else raw.split(b"\0")
    return out

