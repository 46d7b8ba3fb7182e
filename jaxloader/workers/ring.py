"""The ring of shared-memory slots that batches are collated into.

::

    free ──take()──> lent to a task ──(worker fills it)──> hand_out() ──> user's NumPy views
      ^                  │ grow(): a bigger segment replaces it         │
      └──────────────────┴──── give_back() / views garbage-collected <──┘

A slot is a ``Segment`` reused batch after batch (no per-batch segment in steady state). It goes
back to the free list only when nothing can read it any more: a ``weakref.finalize`` on the one
base array that every handed-out view hangs from. New slots are created at the largest size seen,
so variable-length data grows the ring once, not every batch. The ring owns (and at ``close()``
unlinks) every segment; a slot whose views outlive ``close()`` is unmapped when they die.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import Any

import numpy as np

from jaxloader.collate import Layout
from jaxloader.workers.shm import Segment

_GROWTH = 1.25  # a slot that must grow gets 25% headroom, so slowly growing data grows rarely


class SlotRing:
    """Owns the slots; see the module docstring. Not thread-safe except ``_release``."""

    def __init__(self) -> None:
        self._free: list[Segment] = []
        self._released: deque[Segment] = deque()  # appended by finalizers, from any thread
        self._segments: dict[str, Segment] = {}
        self._size = 0  # bytes: the size new slots get
        self._closed = False
        self._lock = threading.Lock()  # orders _release against close()

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    def take(self) -> Segment:
        """A free slot (the largest size seen so far), created if none is free."""
        while self._released:
            self._free.append(self._released.popleft())
        while self._free:
            segment = self._free.pop()
            if segment.size >= self._size:
                return segment
            self._destroy(segment)  # too small for current batches: replace it
        return self._create(self._size)

    def grow(self, segment: Segment, nbytes: int) -> Segment:
        """Replaces a lent slot that is too small by one of at least ``nbytes``."""
        self._size = max(self._size, int(nbytes * _GROWTH))
        self._destroy(segment)
        return self._create(self._size)

    def give_back(self, segment: Segment) -> None:
        """Returns a slot nobody reads (a stale or failed task's)."""
        self._free.append(segment)

    def hand_out(self, segment: Segment, layout: Layout, objects: list) -> Any:
        """The batch in ``segment`` as NumPy views; the slot returns when they are all gone."""
        base = np.frombuffer(segment.buf, np.uint8, count=layout.nbytes)
        weakref.finalize(base, self._release, segment)
        return layout.views(base, objects)

    def _release(self, segment: Segment) -> None:
        with self._lock:
            if not self._closed:  # else: close() unlinked it; it unmaps when the views go
                self._released.append(segment)

    def _create(self, size: int) -> Segment:
        segment = Segment.create(size)
        self._segments[segment.name] = segment
        return segment

    def _destroy(self, segment: Segment) -> None:
        self._segments.pop(segment.name, None)
        segment.destroy()  # unmapped now, or when the last view of it dies

    def close(self) -> None:
        """Unlinks every segment; unmaps those no view reads. Idempotent."""
        with self._lock:
            self._closed = True
        for segment in list(self._segments.values()):
            segment.destroy()
        self._segments.clear()
        self._free.clear()
        self._released.clear()
