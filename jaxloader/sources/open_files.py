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
import threading
from typing import Any, Callable, Hashable

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
    """Open handles by key, at most ``limit``; ``close(handle)`` closes one."""

    def __init__(self, limit: int, close: Callable[[Any], Any]) -> None:
        self._limit, self._close = limit, close
        self._open: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()

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
        self._open[key] = handle
        while len(self._open) > self._limit:
            self.drop(next(iter(self._open)))
        if get_worker_info() is not None:
            most = worker_budget()
            with _GUARD:
                _EVERY[(id(self), key)] = self
                while len(_EVERY) > most:
                    (_, oldest), owner = next(iter(_EVERY.items()))
                    owner.drop(oldest)
        return handle

    def drop(self, key: Hashable) -> None:
        """Closes ``key``'s handle, if open."""
        with _GUARD:
            _EVERY.pop((id(self), key), None)
        handle = self._open.pop(key, None)
        if handle is not None:
            self._close(handle)

    def close(self) -> None:
        """Closes every handle (a later ``add`` opens again)."""
        while self._open:
            self.drop(next(reversed(self._open)))
