"""The ring of shared-memory slots that batches are collated into.

::

    free ──take()──> lent to a task ──(worker fills it)──> hand_out() ──> user's NumPy views
      ^                  │ grow(): a bigger segment replaces it         │
      └──────────────────┴──── give_back() / views garbage-collected <──┘

A slot is a ``Segment`` reused batch after batch (no per-batch segment in steady state). It goes
back to the free list only when nothing can read it any more: a weak reference to the one base
array that every handed-out view hangs from. Its callback is ``deque.append``, a builtin: no
Python code runs when the views die, so a Ctrl-C can never land in (and be swallowed by) a slot
return, as it could in a ``weakref.finalize`` callback (``jaxloader.base.interrupts``, 5). New
slots are created at the largest size seen lately, so variable-length data grows the ring once,
not every batch; every ``_SETTLE`` batches, when the largest batch of the last ``_SETTLE`` to
``2 * _SETTLE`` is under 40% of the slot size, the size comes down to it, 25% more (an outlier
is so forgotten 2 to 3 times ``_SETTLE`` batches after it; one outlier batch grew every slot
for good, and the pool, which sizes its tasks by the slots, then ran a step a task: 3x slower
for the rest of the run). The ring owns
(and at ``close()`` unlinks) every segment; a slot whose views outlive ``close()`` is unmapped
when they die.

A slot goes back to the worker that wrote it last (``take(worker)``: its own free slots first,
then another's, then a new one): a worker maps each slot it writes once and keeps the mapping
(``worker._Slots``), so with slots shared at random among N workers each worker would map
every slot of the ring, N times the mappings, or, past its cache's bound, map and unmap on
nearly every batch, which would eat what a deeper pipeline gains.

A slot's memory file holds a descriptor of this process while it is linked (so that workers can
open it). Batches kept alive keep their slots: past ``tasks.ahead_slots()`` of them (a quarter of
what the other loaders' rings leave of the descriptor limit), the oldest kept is unlinked (its
mapping stays; its descriptor closes) and destroyed, not reused, when its views die:
``list(loader)`` of 2,500 batches ran out of descriptors at a limit of 1,024. Free slots past
the most in use in the last ``_SETTLE`` to ``2 * _SETTLE`` batches (and ``_SPARE``) go at each
settle: batches kept and dropped since no longer hold memory and descriptors for the loader's
life. From the first batch kept (still held ``_KEPT_AFTER`` batches later, or unlinked so),
leaves of ``SMALL_LEAF`` bytes or fewer are handed out as copies: an evaluation keeping each
batch's labels (256 bytes) for its metric held each batch's whole slot (a megabyte a step, and
its descriptor until unlinked: out of them after 173 batches under a limit of 256 on Python
3.11). A copy costs about 0.4 us a leaf.

With a ``pinner`` (batches placed on a GPU: ``jaxloader.sharding.pinning``) each slot is
registered with the device as it is made, for copies straight from it, and unregistered before
it is unmapped, never while its views live (a copy in flight reads it): only ``close()`` meets
a slot still read (settles and grows release free slots, or slots a worker writes), which
then waits for its views in ``workers/unpinning.py``.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from collections import deque
from typing import Any

import numpy as np

from jaxloader.batching.collate import Layout
from jaxloader.runtime.descriptors import open_descriptors
from jaxloader.runtime.shm import Segment
from jaxloader.workers import unpinning
from jaxloader.workers.tasks import ahead_slots

_RINGS: weakref.WeakSet = weakref.WeakSet()  # the rings not closed, of every loader alive
_LOCK = threading.RLock()  # (loaders made in several threads at once; reentrant: a loader
# collected as a ring is made, its ring closed in that thread, takes it again)


def _forked() -> None:
    """A forked child has none of its parent's rings, nor the lock another thread held."""
    global _LOCK
    _RINGS.clear()
    _LOCK = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _budget(others: list[SlotRing]) -> int:
    """A new ring's slots: ``tasks.ahead_slots`` of the descriptors left by those open and the
    slots ``others`` (the rings of the loaders alive) may still make: up to half as many again
    as their budget (the steps ahead are within it, the tasks being submitted and the batches
    the loop holds are not)."""
    if not others:  # (alone: a quarter of the limit, as before other loaders counted)
        return ahead_slots()
    most = [r.budget * 3 // 2 for r in others]
    coming = sum(max(0, m - r.segment_count) for m, r in zip(most, others))
    opened = open_descriptors()
    if opened is None:  # (no /proc: the others' whole budgets)
        opened, coming = 0, sum(most)
    return ahead_slots(opened + coming, len(others))  # (a slot: a descriptor, runtime.mapping)

_GROWTH = 1.25  # a slot that must grow gets 25% headroom, so slowly growing data grows rarely
_SETTLE = 512  # batches handed out between looks at the slot size (module docstring)
_SPARE = 4  # free slots kept past the most in use lately
SMALL_LEAF = 1 << 16  # bytes: a leaf this small is handed out as a copy once batches are kept
_KEPT_AFTER = 64  # a batch still held this many batches after it was handed out is kept


class SlotRing:
    """Owns the slots; see the module docstring. Not thread-safe, except that views may die
    in any thread."""

    def __init__(self, pinner: Any = None) -> None:
        self._pinner = pinner  # pin(segment), unpin(segment), pinned(segment), or None
        self._free: dict[int, list[Segment]] = {}  # by the worker that wrote them last
        self._worker_of: dict[str, int] = {}  # slot name -> the worker it was taken for last
        self._lent: dict[int, tuple[weakref.ref, Segment]] = {}  # id(ref) -> (ref, its slot)
        self._dead: deque[weakref.ref] = deque()  # refs whose views died (appended atomically)
        self._segments: dict[str, Segment] = {}
        self._size = 0  # bytes: the size new slots get
        self._known = False  # whether a batch has been written: until then slot_size is 0
        self._largest = [0, 0]  # bytes of the largest batch handed out: the window before, this
        self._busiest = [0, 0]  # the most slots not free as a batch was handed out: the same
        self._handed = 0  # batches handed out
        self._copied = 0  # leaves of this many bytes or fewer are handed out as copies
        with _LOCK:
            self._kept_linked = _budget(list(_RINGS))  # slots lent and linked at most
            _RINGS.add(self)
        # the refs of the slots lent, in order (some returned since): a ref, not its id, which
        # a later ref may take once it is freed (that slot was then unlinked in turn)
        self._lent_order: deque[weakref.ref] = deque()

    @property
    def budget(self) -> int:
        """The slots this ring keeps linked at most: its loader's steps ahead are fewer."""
        return self._kept_linked

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def held_bytes(self) -> int:  # (a copy of the values: the prefetch thread adds and drops)
        return sum(s.size for s in list(self._segments.values()))

    @property
    def slot_size(self) -> int:
        """The bytes new slots get: at least the largest batch seen lately (a page at least,
        25% more after a grow); 0 until a batch has been seen (grown into or handed out),
        however many slots of a page were made before: the pool sizes its tasks by it."""
        return self._size if self._known else 0

    def take(self, worker: int = 0) -> Segment:
        """A free slot (the largest size seen so far) for ``worker`` to write: one it wrote
        before if any is free, else another's, else a new one."""
        while self._dead:
            _, segment = self._lent.pop(id(self._dead.popleft()))
            self.give_back(segment)
        for free in (self._free.get(worker), *self._free.values()):
            while free:
                segment = free.pop()
                if segment.size >= self._size:
                    self._worker_of[segment.name] = worker
                    return segment
                self._destroy(segment)  # too small for current batches: replace it
        return self._create(self._size, worker)

    def grow(self, segment: Segment, nbytes: int) -> Segment:
        """Replaces a lent slot that is too small by one of at least ``nbytes``."""
        self._size = max(self._size, int(nbytes * _GROWTH))
        self._known = True
        worker = self._worker_of.get(segment.name, 0)
        self._destroy(segment)
        return self._create(self._size, worker)

    def give_back(self, segment: Segment) -> None:
        """Returns a slot nobody reads (a stale or failed task's, or one whose views died); one
        unlinked while its batch was kept is destroyed."""
        if not segment.linked or segment.size > 2 * self._size:  # (or made before a settle)
            self._destroy(segment)
            return
        self._free.setdefault(self._worker_of.get(segment.name, 0), []).append(segment)

    def hand_out(self, segment: Segment, layout: Layout, objects: list) -> Any:
        """The batch in ``segment`` as NumPy views; the slot returns when they are all gone."""
        nbytes = layout.size(objects)
        base = np.frombuffer(segment.memory, np.uint8, count=nbytes)
        self._known = True
        largest = self._largest
        if nbytes > largest[1]:
            largest[1] = nbytes
        busy = len(self._segments) - sum(map(len, self._free.values()))
        if busy > self._busiest[1]:
            self._busiest[1] = busy
        self._handed += 1
        if self._handed % _SETTLE == 0:
            self._settle()
        ref = weakref.ref(base, self._dead.append)
        self._lent[id(ref)] = (ref, segment)  # the ref must outlive the views to call back
        order = self._lent_order
        order.append(ref)
        if not self._copied and self._handed % _KEPT_AFTER == 0 and len(order) >= _KEPT_AFTER:
            if order[-_KEPT_AFTER]() is not None:  # (a batch still held this many later: kept)
                self._copied = SMALL_LEAF
        while len(order) > self._kept_linked:  # (batches kept: the oldest's descriptor goes)
            old = order.popleft()
            kept = self._lent.get(id(old))
            if kept is not None and kept[0] is old and old() is not None:  # (not one whose
                kept[1].unlink()  # views died since the last take(): it comes back linked)
                self._copied = SMALL_LEAF  # (a leaf kept holds a copy, not a whole slot)
        return layout.views(base, objects, self._copied)

    def _settle(self) -> None:
        """Brings the slot size down to the last windows' largest batch, 25% more, where that
        is under half of it; free slots over twice the new size go (module docstring). Free
        slots past the most in use lately go too: batches a loop kept (a ``list(loader)``,
        ``itertools.cycle``'s cache) grew the ring, which kept their slots, and a descriptor
        each, for the loader's life once they were dropped."""
        wanted = max(mmap.PAGESIZE, int(max(self._largest) * _GROWTH))
        self._largest[:] = [self._largest[1], 0]
        if self._size > 2 * wanted:
            self._size = wanted
            for free in self._free.values():
                for segment in [s for s in free if s.size > 2 * wanted]:
                    free.remove(segment)
                    self._destroy(segment)
        free_now = sum(map(len, self._free.values()))
        in_use = len(self._segments) - free_now
        spare = free_now - max(0, max(self._busiest) + _SPARE - in_use)
        self._busiest[:] = [self._busiest[1], 0]
        for free in self._free.values():
            while spare > 0 and free:
                self._destroy(free.pop(0))
                spare -= 1

    def _create(self, size: int, worker: int) -> Segment:
        # close() finds it, cut short too. Not prefaulted: its pages are reserved (allocated and
        # zeroed) already, the worker's writes fault in its own mapping either way, and this
        # process only reads it (16 pages a fault); touching each page here cost 138 against
        # 30 us a slot of 7 pages, ~20 ms of the main process as a read-local pass starts
        segment = Segment.create(size, prefault=False, registry=self._segments)
        self._worker_of[segment.name] = worker
        if self._pinner is not None:
            self._pinner.pin(segment)
        self._size = max(self._size, segment.size)  # (a whole page at least)
        return segment

    def _destroy(self, segment: Segment) -> None:
        self._release(segment)  # (first: cut short, it stays listed for close())
        self._segments.pop(segment.name, None)
        self._worker_of.pop(segment.name, None)

    def _release(self, segment: Segment) -> None:
        """Destroys ``segment``: unmapped now, or when the last view of it dies; a pinned one
        unpinned first, once no view of it is alive (module docstring)."""
        if self._pinner is None or not self._pinner.pinned(segment):
            segment.destroy()
            return
        read = next((base for ref, lent in self._lent.values()
                     if lent is segment and (base := ref()) is not None), None)
        unpinning.release(segment, self._pinner, read)

    def close(self) -> None:
        """Unlinks every segment; unmaps those no view reads (the rest when their views die).
        Idempotent."""
        with _LOCK:
            _RINGS.discard(self)
        for segment in list(self._segments.values()):
            self._release(segment)
        self._segments.clear()
        self._free.clear()
        self._worker_of.clear()
        self._lent.clear()
        self._lent_order.clear()
        self._dead.clear()
