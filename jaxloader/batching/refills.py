"""``RecordRefills``: a ``DataLoader``'s first records, watched for a buffer filled again.

A source whose ``__getitem__`` fills one array and returns it for every record (a fast
reader's habit), or a ``Map`` that writes its output into one array it keeps, changes the
records read before, which wait for the batch to be stacked: each row then holds the last
record's values, without a word. A batch maker reads its first ``CHECKED`` records (in each
process) through this watch, as a stream's reader reads a shard's (``streams.refill_watch``,
whose samples it takes): just before a record is read, a sample of each array the record
before holds is taken, and it is compared after the read, then after the record's
transforms. Only the source's code ran between the first two, only the transforms' between
the last two, so a change names which refilled a buffer. Records read on threads
(``read_threads=``) are all read first, each sampled on its thread as it is read, and compared
once the reads ended (``each``), before their transforms run. Then the watch steps
aside.

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
from typing import Any, Callable, Sequence


from jaxloader.base.errors import JaxloaderWarning, user_stacklevel
from jaxloader.base.read_threads import each
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
        no read on threads meanwhile; records read before, all at once, are watched for
        their transforms)."""
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
        self._say(where, source, transforms, back == 1, "read the next record")

    def each(self, source: Any, items: list, failed: Callable[[int, Exception], Exception],
             located: Callable[[int, Any], Any]) -> list:
        """``read_threads.each(source.__getitem__, items, failed, located)``: the records read
        on this thread's read threads; a process's first ones each sampled on its thread as it
        is read, and compared once the reads ended (a source that fills one buffer again
        changes the records its other threads read before)."""
        if self.left <= 0:
            return each(source.__getitem__, items, failed, located)
        taken: list = []

        def reading(item: Any) -> Any:
            record = source[item]
            taken.append((record, samples(record)))
            return record
        records = each(reading, items, failed, located)
        for record, sampled in taken:
            if (where := changed(sampled, record)) is not None:
                self._say(where, source, (), True, "read other records on its read threads")
                break
        return records

    def _say(self, where: str, source: Any, transforms: Sequence[Any], by_source: bool,
             doing: str) -> None:
        self.left = 0  # (said once: its other records are as refilled)
        name = (f"the source ({type(source).__qualname__})" if by_source else
                f"the record transforms ({', '.join(repr(t) for t in transforms)})")
        if name in SAID:
            return
        SAID.add(name)
        warnings.warn(
            f"DataLoader: a record's leaf {where} changed as {name} "
            + (doing if by_source else "ran on the next record")
            + ": it fills one buffer again and returns it for each record, so the records of "
            "a batch each hold the last one's values; return a new array for each record (a "
            "copy: buf.copy())" + (" from __getitem__" if by_source else " from the Map"),
            JaxloaderWarning, stacklevel=user_stacklevel())
