"""``RecordRefills``: a ``DataLoader``'s first records, watched for a buffer filled again.

A source whose ``__getitem__`` fills one array and returns it for every record (a fast
reader's habit), or a ``Map`` that writes its output into one array it keeps, changes the
records read before, which wait for the batch to be stacked: each row then holds the last
record's values, without a word. A batch maker reads its first ``CHECKED`` records (in each
process) through this watch, as a stream's reader reads a shard's (``streams.refill_watch``,
whose samples it takes): just before a record is read, a sample of each array the record
before holds is taken, and it is compared after the read, then after the record's
transforms. Only the source's code ran between the first two, only the transforms' between
the last two, so a change names which refilled a buffer. Then the watch steps aside.

Example:
    >>> import warnings, numpy as np
    >>> class Refilled:
    ...     buffer = np.zeros(2)
    ...     def __getitem__(self, i):
    ...         self.buffer[:] = i
    ...         return {"x": self.buffer}
    >>> watch, source, records = RecordRefills(), Refilled(), []
    >>> with warnings.catch_warnings(record=True) as said:
    ...     warnings.simplefilter("always")
    ...     for i in range(2):
    ...         before = watch.before(records, True)
    ...         record = source[i]
    ...         watch.after(before, records, source, ())
    ...         records.append(record)
    >>> str(said[0].message)[:70]
    "DataLoader: a record's leaf ['x'] changed as the source (Refilled) rea"
"""

from __future__ import annotations

import warnings
from typing import Any, Sequence


from jaxloader.base.errors import JaxloaderWarning, user_stacklevel
from jaxloader.streams.refill_watch import changed, samples

CHECKED = 3  # records watched in each process (a buffer refilled shows at the second)
SAID: set[str] = set()  # the sources' and transforms' kinds warned of, in this process


class RecordRefills:
    """The watch of a batch maker's first records (see the module docstring): plain data, a
    copy in each worker."""

    def __init__(self) -> None:
        self.left = CHECKED

    def before(self, records: list, watched: bool) -> list | None:
        """The samples of the record before the one about to be read, in a list ``after``
        empties once it said a change (``None``: none read, or watched enough; ``watched``:
        read one by one, in order, not on threads)."""
        if not watched or not records or self.left <= 0:
            return None
        self.left -= 1
        return [samples(records[-1])]

    def after(self, before: list | None, records: list, source: Any, transforms: Sequence[Any],
              back: int = 1) -> None:
        """Warns once where the record before (``records[-back]``) changed since ``before``
        was taken: by the source's read, or (``back=2``: the record read is appended) by the
        transforms run on the record read."""
        if not before:
            return
        where = changed(before[0], records[-back])
        if where is None:
            return
        before.clear()  # (the source's refill, said: not the transforms' too)
        self.left = 0  # (said once: its other records are as refilled)
        by_source = back == 1
        name = (f"the source ({type(source).__qualname__})" if by_source else
                f"the record transforms ({', '.join(repr(t) for t in transforms)})")
        if name in SAID:
            return
        SAID.add(name)
        warnings.warn(
            f"DataLoader: a record's leaf {where} changed as {name} "
            + ("read the next record" if by_source else "ran on the next record")
            + ": it fills one buffer again and returns it for each record, so the records of "
            "a batch each hold the last one's values; return a new array for each record (a "
            "copy: buf.copy())" + (" from __getitem__" if by_source else " from the Map"),
            JaxloaderWarning, stacklevel=user_stacklevel())
