"""A worker's heap keeps the pages its last batch freed, so the next batch reuses them.

A per-record transform that returns new arrays (a crop cast to float32: 432 KiB a record) fills
a batch's worth of them before they are stacked into the slot, then frees them all at once.
glibc's malloc hands a freed top of the heap back to the system once it is larger than its trim
threshold (by default twice the largest block it has freed from ``mmap``: under 1 MiB there), so
every batch would fault its records' pages in again.

In a worker (our process, nobody else's allocator to tune), blocks up to 32 MiB come from the
heap, and the heap keeps a freed top of up to the largest batch made so far plus 64 MiB (at most
1 GiB). That costs no peak memory in the steady state (the next batch allocates the same pages
again); only after a one-off spike does the worker hold more than it uses. Elsewhere than glibc
(macOS, musl) this does nothing.
"""

from __future__ import annotations

import ctypes
import os
from typing import Callable

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD = 32 << 20  # glibc's largest default threshold on 64-bit
SLACK = 64 << 20
MAX_KEPT = 1 << 30


def _glibc_mallopt() -> Callable[[int, int], int] | None:
    try:
        os.confstr("CS_GNU_LIBC_VERSION")  # raises elsewhere than glibc
        return ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, ValueError):
        return None


class Heap:
    """Tunes this process's malloc for batches of ``fit(nbytes)`` bytes; see the module."""

    def __init__(self) -> None:
        self._mallopt = _glibc_mallopt()
        self.kept = 0
        if self._mallopt is not None:
            self._mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
            self.fit(0)

    def fit(self, nbytes: int) -> None:
        """Keeps a freed top of the heap up to ``nbytes`` + ``SLACK`` (never less than before)."""
        kept = min(nbytes + SLACK, MAX_KEPT)
        if self._mallopt is not None and kept > self.kept:
            self._mallopt(_M_TRIM_THRESHOLD, kept)
            self.kept = kept
