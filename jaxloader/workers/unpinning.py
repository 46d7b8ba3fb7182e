"""Pinned slots released while still read: unpinned, then unmapped, once their views are gone.

A slot registered with a GPU (``jaxloader.sharding.pinning``) must be unregistered before it is
unmapped, and never while a view of it is alive: a copy in flight reads it (JAX holds the host
array until the copy is done), as does a batch the device-put thread or the user still holds.
Only a ring's ``close()`` releases such a slot (its settles and grows release free slots, or
slots a worker is writing), so it waits here: a weak reference to the object its views hang
from wakes a thread, ``jaxloader-unpin``, as it dies; the thread unpins the slot and unmaps it.

Why a thread: the views die wherever the user drops them, possibly long after every loader is
closed, so no later call of ours is sure to come; the reference's callback is
``SimpleQueue.put``, a builtin, so no Python code runs where the views die (a Ctrl-C can never
land in it, ``jaxloader.base.interrupts``, 5), and none reaches the thread. It starts with the
first slot that waits and ends when none is left.

Example:
    >>> import numpy as np
    >>> from jaxloader.runtime.shm import Segment
    >>> class Pinner:  # (a GPU's: jaxloader.sharding.pinning.Pinner)
    ...     def unpin(self, segment):
    ...         print("unpinned", segment.buf is not None)
    ...         return True
    >>> slot = Segment.create(4096)
    >>> view = np.frombuffer(slot.memory, np.uint8)
    >>> release(slot, Pinner(), view)  # read: it waits
    >>> del view
    >>> wait_all(5.0)  # the thread unpinned it while it was mapped, then unmapped it
    unpinned True
    True
    >>> slot.buf is None
    True
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
import traceback
import weakref
from typing import Any

from jaxloader.runtime.shm import Segment

_WAITING: dict[int, tuple[weakref.ref, Segment, Any]] = {}  # (its views' base, slot, pinner)
_NUMBERS = itertools.count()  # the keys of _WAITING
_DOING: dict[tuple[int, int], Any] = {}  # (key, thread) -> a slot claimed, not yet unpinned
_KEPT: list[Segment] = []  # slots whose unpinning raised: mapped for good (not unmapped
# registered), the error printed
_WAKE: queue.SimpleQueue = queue.SimpleQueue()  # a base died
_THREAD: list[threading.Thread] = []  # the one running, while slots wait


def release(segment: Segment, pinner: Any, base: Any) -> None:
    """Destroys the pinned ``segment``: unpinned by ``pinner`` now, then unmapped; or, while
    ``base`` (what its views hang from; None: no view) is alive, unlinked now and both done by
    the thread once it dies. A slot ``pinner.unpin`` could not unregister stays mapped.

    No lock is taken (a Ctrl-C between a ``with lock:`` and its body can leave it held for
    good): an entry is filed and claimed by single dict operations, atomic, and a second
    thread, started by a race, only claims entries the first has not."""
    if base is None:
        _unpin(segment, pinner)
        return
    segment.unlink()  # (no worker opens it again; its memory goes with the last mapping)
    _WAITING[next(_NUMBERS)] = (weakref.ref(base, _WAKE.put), segment, pinner)
    if not (_THREAD and _THREAD[0].is_alive()):  # (after filing: cut short, it waits, mapped)
        thread = threading.Thread(target=_unpin_dead, name="jaxloader-unpin", daemon=True)
        _THREAD[:] = [thread]
        thread.start()


def waiting() -> int:
    """Pinned slots still read, or being unpinned."""
    return len(_WAITING) + len(_DOING)


def wait_all(timeout_s: float) -> bool:
    """Whether every waiting slot was unpinned within ``timeout_s`` (for tests and benchmarks)."""
    deadline = time.monotonic() + timeout_s
    while waiting() and time.monotonic() < deadline:
        time.sleep(0.01)
    return not waiting()


def _unpin(segment: Segment, pinner: Any) -> None:
    if pinner.unpin(segment):
        segment.destroy()


def _unpin_dead() -> None:
    """The thread: unpins and unmaps each waiting slot whose views died, as they die; ends
    once none waits (looked at again after it stopped counting as running: a slot filed
    meanwhile either keeps it going or, not seeing it run, starts another)."""
    while True:
        _WAKE.get()
        for key, kept in list(_WAITING.items()):
            if kept[0]() is not None:
                continue
            doing = (key, threading.get_ident())
            _DOING[doing] = kept  # (before the claim: wait_all() never sees neither)
            try:
                if _WAITING.pop(key, None) is not None:  # (claimed: one thread does it)
                    _unpin(kept[1], kept[2])
            except Exception:  # noqa: BLE001 - said, and the thread goes on with the others
                _KEPT.append(kept[1])
                traceback.print_exc()
            finally:
                del _DOING[doing]
        if not _WAITING:
            _THREAD.clear()
            if not _WAITING:
                return
            _THREAD[:] = [threading.current_thread()]


def _forked() -> None:
    """A forked child has no thread, and none of its parent's registrations to undo."""
    global _WAKE
    _WAKE = queue.SimpleQueue()
    _WAITING.clear()
    _DOING.clear()  # (a parent's thread's, cut by the fork: no slot of this process)
    _THREAD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
