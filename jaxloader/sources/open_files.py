"""``OpenFiles``: the files a source holds open in a process, at most a few, the least recently
used closed first: a dataset of thousands of files must not hold a descriptor each (a soft
limit of 1,024 is common, and every worker holds its own). In a worker every source's count
together too (``worker_budget``): a mixture of hundreds of one-file sources held hundreds.

Example:
    >>> files = OpenFiles(2, close=list.clear)
    >>> a, b, c = files.add(0, [1]), files.add(1, [2]), files.add(2, [3])
    >>> files.get(0), files.get(2), a
    (None, [3], [])
"""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Any, Callable, Hashable, Iterator

from jaxloader.base.source_locks import OwnLock
from jaxloader.runtime.descriptors import descriptor_share
from jaxloader.runtime.worker_info import get_worker_info

# In a worker: every source's open handles, least recently used first. Not in the training
# process, where two threads may read two sources at once (one would close the other's file
# as it reads). A worker's read threads (read_threads=) may add to it at once: under _GUARD.
_EVERY: "collections.OrderedDict[tuple[int, Hashable], OpenFiles]" = collections.OrderedDict()
_GUARD = threading.RLock()


def worker_budget() -> int:
    """The files a worker holds open, every source's together: a quarter of its descriptor
    limit, 4 to 256."""
    return descriptor_share(4, 256, untracked=True)


class OpenFiles:
    """Open handles by key, at most ``limit``; ``close(handle)`` closes one. A handle read
    through ``using`` is closed, if dropped meanwhile (past the limit, by another source's
    open in a worker, by ``close()``), by the last read through it: read threads read through
    one handle at once, and an open on one closed it under another ("Object closed")."""

    def __init__(self, limit: int, close: Callable[[Any], Any]) -> None:
        self._limit, self._close = limit, close
        self._open: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._lock = OwnLock()  # (the handles, their readers and those to close late)
        self._readers: dict[int, int] = {}  # id(handle) -> reads through it now
        self._late: dict[int, Any] = {}  # handles dropped as they were read through

    @contextlib.contextmanager
    def using(self, key: Hashable, opened: Callable[[], Any]) -> Iterator[Any]:
        """``key``'s handle (``opened()`` makes it if none is open), kept open while the block
        reads through it."""
        with self._lock:
            handle = self.get(key)
            evicted = [] if handle is not None else self._keep(key, handle := opened())
            self._readers[id(handle)] = self._readers.get(id(handle), 0) + 1
        for owner, oldest in evicted:  # (another source's: outside this one's lock)
            owner.drop(oldest)
        try:
            yield handle
        finally:
            with self._lock:
                left = self._readers.pop(id(handle)) - 1
                if left:
                    self._readers[id(handle)] = left
                late = None if left else self._late.pop(id(handle), None)
            if late is not None:
                self._close(late)

    def get(self, key: Hashable) -> Any:
        """The handle of ``key`` (now the most recently used), or ``None`` if not open."""
        handle = self._open.get(key)
        if handle is not None:
            self._open.move_to_end(key)
            with _GUARD:
                if (id(self), key) in _EVERY:
                    _EVERY.move_to_end((id(self), key))
        return handle

    def add(self, key: Hashable, handle: Any) -> Any:
        """Keeps ``handle`` as ``key``'s, closing the least recently used past the limit (this
        source's, and in a worker every source's)."""
        with self._lock:
            evicted = self._keep(key, handle)
        for owner, oldest in evicted:
            owner.drop(oldest)
        return handle

    def _keep(self, key: Hashable, handle: Any) -> list[tuple["OpenFiles", Hashable]]:
        """``add``'s, under the lock: this source's past the limit dropped; returns the other
        sources' handles past a worker's budget, for the caller to drop outside the lock (two
        sources' locks taken in turn, by two threads in two orders, waited for each other)."""
        self._open[key] = handle
        while len(self._open) > self._limit:
            self.drop(next(iter(self._open)))
        evicted = []
        if get_worker_info() is not None:
            most = worker_budget()
            with _GUARD:
                _EVERY[(id(self), key)] = self
                for (_, oldest), owner in list(_EVERY.items())[:max(0, len(_EVERY) - most)]:
                    _EVERY.pop((id(owner), oldest), None)
                    if owner is self:
                        self.drop(oldest)
                    else:
                        evicted.append((owner, oldest))
        return evicted

    def drop(self, key: Hashable) -> None:
        """Closes ``key``'s handle, if open (once its reads end, if it is being read)."""
        with self._lock:
            with _GUARD:
                _EVERY.pop((id(self), key), None)
            handle = self._open.pop(key, None)
            if handle is None or self._readers.get(id(handle)):
                if handle is not None:
                    self._late[id(handle)] = handle
                return
        self._close(handle)

    def close(self) -> None:
        """Closes every handle (a later ``add`` opens again)."""
        while self._open:
            self.drop(next(reversed(self._open)))
