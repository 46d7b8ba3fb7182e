"""One lock per source object, held while this process reads it outside a worker.

With ``num_workers=0`` a loader's batches are made in the thread that asks for them, or in its
device-put thread (``sharding=``); ``peek()`` makes one in the calling thread meanwhile, and
two loaders may read one source object (train and eval over the same files). A source need
not be safe for two threads at once: a ``ParquetSource`` reads through one pyarrow file and
one cache, where two threads crashed the process (a segfault in ``read_row_group``) or gave
"the file is damaged". Batches made from one source object in this process are made one at
a time (``engines.in_process.made_here``), and its files are closed between them
(``sources.parts.close_source``). Workers read their own copies and take no lock.

An object that takes no weak reference (a list of records, a tuple) gets a lock of its own
at each call, which holds nothing back: Python's own containers are read safely from two
threads, and a lock kept for it could not be dropped with it.

A source made of others (a mixture, a concatenation, a filter over one) holds the lock of
each of them, taken in one order (by ``id``: no two threads wait on each other), since two
loaders may share a part and not the whole.

Example:
    >>> class Source: ...
    >>> a, b = Source(), Source()
    >>> held = SourceLock([a, b])
    >>> with held:
    ...     lock_of(a).acquire(blocking=False)  # (re-entrant: this thread holds it)
    True
    >>> lock_of(a).release(); lock_of(a) is lock_of(a), lock_of(a) is lock_of(b)
    (True, False)
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Iterable

_LOCKS: dict[int, Any] = {}  # id(object) -> its lock (or a source's SourceLock), while it lives
_GUARD = threading.RLock()  # (a SourceLock made under it finds its parts' locks)


def lock_of(source: Any) -> threading.RLock:
    """The lock of ``source`` (the same object, the same lock; re-entrant)."""
    return _kept(("one", id(source)), source, threading.RLock)


class SourceLock:
    """The locks of ``sources`` (a source and its parts), held together: taken in the order
    of their ids, and let go in the reverse."""

    def __init__(self, sources: Iterable[Any]) -> None:
        self._locks = [lock_of(s) for s in sorted(sources, key=id)]

    def __enter__(self) -> None:
        taken = 0
        try:
            for lock in self._locks:
                lock.acquire()
                taken += 1
        except BaseException:  # (a Ctrl-C between two: none stays held)
            for lock in reversed(self._locks[:taken]):
                lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        for lock in reversed(self._locks):
            lock.release()


def source_lock(source: Any, parts: Any) -> Any:
    """``source``'s lock, made once: a ``SourceLock`` over ``parts(source)`` (its parts and
    itself), or its own lock where it has no parts."""
    def make() -> Any:
        every = list(parts(source))
        return SourceLock(every) if len(every) > 1 else lock_of(source)
    return _kept(("all", id(source)), source, make)


def _kept(key: tuple, owner: Any, make: Any) -> Any:
    found = _LOCKS.get(key)  # (the common case: no lock taken to find it)
    if found is not None:
        return found
    with _GUARD:
        found = _LOCKS.get(key)
        if found is None:
            found = make()
            try:  # dropped with its owner, so that a new object at its id gets its own
                weakref.finalize(owner, _LOCKS.pop, key, None).atexit = False
            except TypeError:  # no weak reference to it (a list, a tuple: Python's own
                return found  # containers read safely from two threads): not kept
            _LOCKS[key] = found
    return found
