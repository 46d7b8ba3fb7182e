"""``OpenFiles``: the files a source holds open in a process, at most a few, the least recently
used closed first: a dataset of thousands of files must not hold a descriptor each (a soft
limit of 1,024 is common, and every worker holds its own).

Example:
    >>> files = OpenFiles(2, close=list.clear)
    >>> a, b, c = files.add(0, [1]), files.add(1, [2]), files.add(2, [3])
    >>> files.get(0), files.get(2), a
    (None, [3], [])
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Hashable


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
        return handle

    def add(self, key: Hashable, handle: Any) -> Any:
        """Keeps ``handle`` as ``key``'s, closing the least recently used past the limit."""
        self._open[key] = handle
        while len(self._open) > self._limit:
            self._close(self._open.popitem(last=False)[1])
        return handle

    def drop(self, key: Hashable) -> None:
        """Closes ``key``'s handle, if open."""
        handle = self._open.pop(key, None)
        if handle is not None:
            self._close(handle)

    def close(self) -> None:
        """Closes every handle (a later ``add`` opens again)."""
        while self._open:
            self._close(self._open.popitem()[1])
