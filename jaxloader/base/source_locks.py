"""One lock per source object, held while this process reads it outside a worker.

With ``num_workers=0`` a loader's batches are made in the thread that asks for them, or in its
device-put thread (``sharding=``); ``peek()`` makes one in the calling thread meanwhile, and
two loaders may read one source object (train and eval over the same files). A source need
not be safe for two threads at once: a ``ParquetSource`` reads through one pyarrow file and
one cache, where two threads crashed the process (a segfault in ``read_row_group``) or gave
"the file is damaged". Batches made from one source object in this process are made one at
a time (``engines.in_process.made_here``), and its files are closed between them
(``sources.parts.close_source``). Workers read their own copies and take no lock.

Only the reads hold them (``reading``, where ``made_under`` asks for it), not the record
transforms between them: a transform that asks another loader over the same source for a
batch (made in its device-put thread) would wait on a lock its own thread held. (What runs
inside a read, a ``MapSource``'s function, still holds them.)

Python's own containers (a list of records, a tuple, a dict) are read safely from two threads,
and take no weak reference: they get a lock of their own at each call, which holds nothing
back. Any other object that takes no weak reference (a class with ``__slots__``) shares one
lock with all such objects: a lock kept for it alone could not be dropped with it (such
sources are then read one at a time in the process, even two unrelated ones). A source's
locks are taken in the order of their ids, so two threads reading never wait on each other;
a read that itself waits on another thread's read (a ``MapSource`` whose function asks a
loader with a device-put thread for a batch) may.

A source made of others (a mixture, a concatenation, a filter over one) holds the lock of
each of them, taken in one order (by ``id``: no two threads wait on each other), since two
loaders may share a part and not the whole; but for parts whose class says its reads are
safe from any thread (``reads_thread_safe``, an ``ArraySource``'s: NumPy's reads of arrays it
holds, read-only), not its subclasses: a concatenation of 50,000 episodes took 50,000 locks a
batch, 42 ms.

Example:
    >>> class Source: ...
    >>> a, b = Source(), Source()
    >>> holding(source_lock(a, lambda s: [s, b]), lambda: lock_of(b).acquire(blocking=False))
    True
    >>> lock_of(b).release(); lock_of(a) is lock_of(a), lock_of(a) is lock_of(b)
    (True, False)
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import Any, Callable

_LOCKS: dict[tuple, Any] = {}  # (kind, id) -> a lock, or a source's parts' locks, while it lives
_GUARD = threading.RLock()  # (parts' locks are found under it as a source's are made)
_UNREFERENCED = threading.RLock()  # the lock of every object that takes no weak reference
_CONTAINERS = (list, tuple, dict, str, bytes, range)  # read safely from two threads
_HELD = threading.local()  # .locks: what ``reading`` holds in this thread (``made_under``)


def _forked() -> None:
    """In a forked child (a worker, a transform's fork) only the forking thread goes on: its
    reads hold none of the parent's locks, whose copies may be held for good (by a thread
    that is not in the child: a filter made in a forked worker's init waited for ever), so
    every source gets a new one."""
    global _GUARD, _UNREFERENCED
    _HELD.locks = ()
    _LOCKS.clear()
    _GUARD, _UNREFERENCED = threading.RLock(), threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class OwnLock:
    """A re-entrant lock of a source's own (a ``ParquetSource``'s reads a thread at a time),
    made anew in a forked child: the parent's copy may be held for good there (by a thread
    that is not in the child), and a read in a ``fork`` pool's child waited for ever.

    Example:
        >>> lock = OwnLock()
        >>> with lock, lock:  # (re-entrant)
        ...     pass
    """

    def __init__(self) -> None:
        self._pid, self._lock = os.getpid(), threading.RLock()

    def __enter__(self) -> bool:
        if self._pid != os.getpid():
            self._pid, self._lock = os.getpid(), threading.RLock()
        return self._lock.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._lock.__exit__(*exc)


def lock_of(source: Any) -> threading.RLock:
    """The lock of ``source`` (the same object, the same lock; re-entrant)."""
    return _kept(("one", id(source)), source, threading.RLock)


def source_lock(source: Any, parts: Any) -> tuple[threading.RLock, ...]:
    """``source``'s locks, found once: each of ``parts(source)``'s (its parts and itself), in
    the order of their ids; ``holding`` takes them."""
    return _kept(("all", id(source)), source,
                 lambda: tuple(sorted({id(lock): lock for lock in map(lock_of, (
                     part for part in parts(source) if not type(part).__dict__.get(
                         "reads_thread_safe", False)))}.values(), key=id)))


def made_under(locks: tuple[threading.RLock, ...], fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, each of its ``reading`` calls in this thread holding ``locks`` (what was
    asked before is asked again after: a loader's batch made inside another's transform)."""
    return _with("locks", locks, fn, *args)


def lending(locks: tuple[threading.RLock, ...], fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on a batch's read thread, for the thread that holds ``locks`` (its maker,
    which waits for it): a read there (a filter a source makes as it is first read) takes
    the others only (``lent``)."""
    return _with("lent", locks, fn, *args)


def _with(name: str, locks: tuple, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with this thread's ``_HELD.<name>`` set to ``locks``, then as it was."""
    before = getattr(_HELD, name, ())
    try:
        setattr(_HELD, name, locks)
        done = fn(*args)
    finally:
        setattr(_HELD, name, before)
    return done


def lent() -> tuple[threading.RLock, ...]:
    """The locks the thread this one reads for holds (``lending``), none elsewhere."""
    return getattr(_HELD, "lent", ())


def held() -> tuple[threading.RLock, ...]:
    """The locks this thread's reads of a source hold now (none in a worker)."""
    return getattr(_HELD, "locks", ())


def reading(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, a read of a source, holding the locks ``made_under`` asked for."""
    locks: tuple[threading.RLock, ...] = getattr(_HELD, "locks", ())
    if len(locks) != 1:
        return holding(locks, fn, *args) if locks else fn(*args)
    with locks[0]:  # (the common case, a batch: one lock, taken here)
        done = fn(*args)
    return done


def holding(locks: tuple[threading.RLock, ...], fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with every lock of ``locks`` held, each taken in a ``with`` block of its
    own: a Ctrl-C leaves none held (between a lock's taking and its ``with``, or between two
    releases of a loop, it left one held for good, and the next thread to read hung)."""
    if len(locks) > _PER_FRAME * 400:  # (a mixture of 100,000 parts, one per episode, nests
        frames = len(locks) // _PER_FRAME + 200  # 6,250 blocks: past Python's 1,000 frames)
        if frames > _DEEPEST[0]:  # (raised, never lowered: another thread may be that deep
            _DEEPEST[0] = frames  # now; Python frames, not the C stack's since 3.11)
            sys.setrecursionlimit(max(sys.getrecursionlimit(), frames + 1000))
    return _holding(locks, 0, fn, args)


_PER_FRAME = 16  # locks one frame's ``with`` takes (Python 3.11 compiles up to 20)
_DEEPEST = [0]  # the most frames a ``holding`` has asked for


def _holding(locks: tuple[threading.RLock, ...], i: int, fn: Callable[..., Any],
             args: tuple) -> Any:
    """``holding`` from ``locks[i]`` on (an index, not a slice: slicing a mixture's 4,000
    locks 16 at a time copied 1M of them a batch)."""
    left = len(locks) - i
    if left <= 0:
        return fn(*args)
    if left >= _PER_FRAME:  # (a frame for 16: the same as nested blocks)
        with locks[i], locks[i + 1], locks[i + 2], locks[i + 3], locks[i + 4], \
                locks[i + 5], locks[i + 6], locks[i + 7], locks[i + 8], locks[i + 9], \
                locks[i + 10], locks[i + 11], locks[i + 12], locks[i + 13], locks[i + 14], \
                locks[i + 15]:
            done = _holding(locks, i + _PER_FRAME, fn, args)
        return done
    with locks[i]:
        done = _holding(locks, i + 1, fn, args)  # (kept, not returned, inside the block:
    return done  # what follows a call returned there is the block's, where a Ctrl-C can land)


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
            except TypeError:  # no weak reference to it: not kept (module docstring)
                return found if isinstance(owner, _CONTAINERS) or key[0] == "all" else (
                    _UNREFERENCED)
            _LOCKS[key] = found
    return found
