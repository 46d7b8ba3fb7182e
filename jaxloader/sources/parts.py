"""The sources a source is made of, walked: what a loader closes, what names its files, and
whether one of them reads record by record (what ``read_threads`` can overlap).

A ``ConcatSource`` (a mixture) reads its ``sources``; a wrapper (``MapSource``,
``FilteredSource``, ``PackedSource``) its ``source`` (``jaxloader.base.abilities``). No import of
the sources themselves: the layers above use it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable

import numpy as np

from jaxloader.base.abilities import close_of, origin_of, parts_of
from jaxloader.base.errors import JaxloaderError
from jaxloader.base.source_locks import holding, lent, source_lock


def walk(source: Any) -> Iterator[Any]:
    """``source`` and every source it is made of (``parts_of``), each once, depth first.

    Example:
        >>> from jaxloader.sources import ConcatSource
        >>> a, b = [1, 2], [3]
        >>> [len(s) for s in walk(ConcatSource([a, b]))]
        [3, 2, 1]
    """
    seen: set[int] = set()
    stack = [source]
    while stack:
        each = stack.pop()
        if id(each) in seen:
            continue
        seen.add(id(each))
        yield each
        stack.extend(reversed(parts_of(each)))


def reads_each(source: Any) -> bool:
    """Whether a source in ``source`` reads its records one by one (on a loader's read threads,
    where it has them): one without ``__getitems__``, or one inside jaxloader's wrappers and
    concatenations, which read such a part's records each on the threads."""
    if not hasattr(source, "__getitems__"):
        return True
    defines = next(c for c in type(source).__mro__ if "__getitems__" in vars(c))  # (a user's
    # subclass of a MapSource reads as one)
    parts = parts_of(source)
    return bool(parts) and defines.__module__.startswith("jaxloader.") and any(
        reads_each(part) for part in parts)


def read_locked(source: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, a read of ``source`` made in this process outside a loader's batch (a
    filter's scan, a packer's lengths), holding its locks (``base.source_locks``): two trials'
    filters over one ``ParquetSource`` in two threads, or one while another thread trained on
    it, crashed pyarrow (a segfault, "the file is damaged") or hung. On a batch's read thread
    (a source that makes its filter as it is first read) the locks its maker holds are taken
    as held (``lent``: the maker waits for this read), the others as anywhere."""
    return holding(locks_to_take(source), fn, *args)


def locks_to_take(source: Any) -> tuple:
    """``source``'s locks a read of it here takes (``read_locked``): those a batch's read
    thread's maker holds taken as held."""
    mine = {id(lock) for lock in lent()}
    return tuple(lock for lock in source_lock(source, walk) if id(lock) not in mine)


def scan_read(source: Any, read: Callable[[Any, np.ndarray], list], indices: np.ndarray,
              what: str) -> list:
    """``read(source, indices)`` (``records_at``), ``read_locked``, for ``what``'s pass over
    ``source`` as it is made (a ``FilteredSource``'s scan, a ``PackedSource``'s lengths): a
    read that raises is said in a note on its error (its type kept: an ``OSError`` is one
    still) naming the pass, the record (found again one by one) and where it comes from (a
    bare ``KeyError`` said none of them)."""
    try:
        return read_locked(source, read, source, indices)
    except JaxloaderError:
        raise
    except Exception as e:
        failed = None
        for i in np.asarray(indices).tolist():  # (which record: read again one at a time)
            try:
                read_locked(source, read, source, np.array([i]))
            except Exception:  # noqa: BLE001
                failed = i
                break
        where = origin_of(source, failed) if failed is not None else None
        e.add_note(f"{what}, reading its source once as it is made: " + (
            f"record {failed}{f' ({where})' if where else ''}, source[{failed}], raised this"
            if failed is not None else f"records {int(indices[0])} to {int(indices[-1])} read "
            "together raised this, each read alone did not (a read that fails now and then?)"))
        raise


def close_source(source: Any) -> None:
    """Closes what ``source`` and the sources it is made of hold open in this process (files,
    decoded rows): jaxloader's own sources, which reopen on their next read; a user's source,
    whose ``close`` may end it for good, is left alone."""
    holding(source_lock(source, walk), _close_parts, source)  # (not while a read is made)


def _close_parts(source: Any) -> None:
    for each in walk(source):
        if type(each).__module__.startswith("jaxloader."):
            close_of(each)
