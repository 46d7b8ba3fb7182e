"""A batch's records read on several threads of this process (``DataLoader(read_threads=)``).

Reads that wait (files on a network filesystem, objects in a bucket, a database) leave a process
idle while they do; Grain overlaps them with threads in each worker (its
``ReadOptions(num_threads=16)``). Here a batch's ``source[i]`` calls go to a pool of
``read_threads`` threads, the loader's own (``pool_key``), in the worker or in the process that
makes the batch, and come back in the batch's order: the batch is the same, bit for bit,
whatever the count. Only reads run on the pool; record transforms stay on the batch's thread (in
a worker they run while the later records are still being read).

The count is set for the thread making a batch (``using``) and asked by whatever reads a
record at a time inside it: the ``BatchMaker``, and the sources made of others that read their
parts record by record (``each``). A read made on a pool thread reads its own records one by
one: a source whose read makes another loader's batch cannot wait on threads its own reads
hold.

A read that raises is raised in the batch's order (the first record of the batch that failed),
after what was in flight has finished: no read of the source goes on past the call, which in
the training process holds the source's locks (``base.source_locks``) for the whole read (but
for a Ctrl-C's unwinding, which waits for none: the loader then leaves the source open). The
source must be safe to read from several threads at once, as Grain's must. Such an error is
marked with which of the items it was (``tag_item``), so that the batch maker names that
record; a source that reads its items through others (a concatenation, a packing) turns the
mark into its own, or clears it.

Example:
    >>> using(4, each, lambda i: i * 10, [3, 1, 2])
    [30, 10, 20]
    >>> each(lambda i: 1 // i, [1, 0], failed=lambda j, e: ValueError(f"record {j}: {e}"))
    Traceback (most recent call last):
    ...
    ValueError: record 1: integer division or modulo by zero
"""

from __future__ import annotations

import concurrent.futures as futures
import itertools
import os
import sys
import threading
from typing import Any, Callable, Sequence, TypeVar, Union

from jaxloader.base.daemon_pool import DaemonPool, PoolShut
from jaxloader.base.errors import JaxloaderError
from jaxloader.base.source_locks import held, lending

T = TypeVar("T")
Key = Union[int, tuple]  # a pool's: its count (a batch maker used by hand), or a loader's
_STATE = threading.local()  # .count: this thread's batch's read threads, .key: their pool's;
# .pooled: a pool thread
_POOLS: dict[Key, DaemonPool] = {}  # key -> its pool, in this process
_HOLDERS: dict[Key, int] = {}  # key -> the loaders of this process that read on its pool
_TOKENS = itertools.count()
_GUARD = threading.Lock()
_KEPT = [False]  # this process makes batches for another (``keep``): its pools stay


def _forked() -> None:
    """A forked child has none of its parent's pool threads, nor the thread that may have held
    the guard: it starts pools of its own."""
    global _GUARD
    _GUARD = threading.Lock()
    _POOLS.clear()
    _HOLDERS.clear()


def keep() -> None:
    """This process makes batches for another (a worker, a Ray actor): its pools stay for
    its life, ready for the next task."""
    _KEPT[0] = True


def pool_key(n: int) -> tuple[int, int, int]:
    """A loader's own pool of ``n`` threads (``using``, ``hold``; its workers' copies of its
    batch maker each their own, and a loader made in a worker its own: the process that made
    it is in the key): a pool shared by the process's loaders filled with one loader's reads
    waiting for a source's lock that another loader's batch holds, while that batch waited
    for its own reads queued behind them, for good."""
    return (n, os.getpid(), next(_TOKENS))


def hold(n: Key) -> Callable[[], None]:
    """Keeps the pool of ``n`` (a key) for a loader of this process; the function returned
    lets it go (once), and the pool's threads end when no loader holds it: a closed loader
    leaves no thread. A pool neither held nor kept (a ``BatchMaker`` used by hand) ends with
    each ``Reads`` that used it."""
    with _GUARD:
        _HOLDERS[n] = _HOLDERS.get(n, 0) + 1
    held = [True]

    def release() -> None:
        if not held or not held.pop():
            return
        with _GUARD:
            left = _HOLDERS.pop(n, 0) - 1  # (0 in a forked child: its holders were cleared)
            if left > 0:
                _HOLDERS[n] = left
            pool = None if left > 0 else _POOLS.pop(n, None)
        if pool is not None:
            _let_go(pool)

    return release


def _let_go(pool: DaemonPool) -> None:
    """Ends ``pool``'s threads: idle ones at once; one under way once its read returns (a
    ``close()`` does not wait for it, nor does the process's exit: daemon threads)."""
    pool.shutdown()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def busy(n: Key) -> bool:
    """Whether the pool of ``n`` runs a read now (one a Ctrl-C left under way: its source is
    not to be closed under it)."""
    pool = _POOLS.get(n)
    return pool is not None and pool.busy()


def count() -> int:
    """The read threads of the batch this thread is making (1 outside one, and on a pool
    thread)."""
    return 1 if getattr(_STATE, "pooled", False) else getattr(_STATE, "count", 1)


def current() -> Key:
    """The pool the batch this thread is making reads on (``using``'s)."""
    return getattr(_STATE, "key", count())


def using(n: Key, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` with this thread's reads on the pool of ``n`` (a count, or a loader's key:
    ``pool_key``; what was set before is set again after: a loader's batch made inside
    another's read)."""
    before = getattr(_STATE, "count", 1), getattr(_STATE, "key", 1)
    try:  # (set inside: a Ctrl-C before the try left it set for good, in this thread)
        _STATE.count, _STATE.key = n if isinstance(n, int) else n[0], n
        done = fn(*args)
    finally:
        _STATE.count, _STATE.key = before
    return done


def _pooled() -> None:
    _STATE.pooled = True


def _pool(n: Key) -> DaemonPool:
    pool = _POOLS.get(n)
    if pool is None:
        with _GUARD:
            pool = _POOLS.get(n)
            if pool is None:  # (left open: idle daemon threads, which end with the process)
                pool = _POOLS[n] = DaemonPool(n if isinstance(n, int) else n[0],
                                              "jaxloader-read", initializer=_pooled)
    return pool


class Reads:
    """``read(item)`` of each of ``items``, in flight on ``n`` threads; ``reads[j]`` waits for
    the ``j``-th (raising what it raised). ``close()`` cancels those not started and waits for
    the rest: call it before the source may be read by anyone else. Called as a Ctrl-C (or
    ``sys.exit``) unwinds past, it leaves those under way to end on their own: a read that
    never returns made the first Ctrl-C wait for it, for good."""

    def __init__(self, read: Callable[[Any], Any], items: Sequence[Any], n: Key) -> None:
        self._futures: list[futures.Future] = []
        self._n = n
        mine = held()  # (the locks this thread holds, which the reads take as theirs)
        try:
            for item in items:
                try:
                    self._futures.append(_pool(n).submit(lending, mine, read, item))
                except PoolShut:  # (its pool let go meanwhile by a loader's close())
                    self._futures.append(_pool(n).submit(lending, mine, read, item))
        except BaseException:
            self.close()
            raise

    def __getitem__(self, j: int) -> Any:
        return self._futures[j].result()

    def close(self) -> None:
        for f in self._futures:
            f.cancel()
        # (a cancelled read counts as done for wait() only once a pool thread takes it from
        # the queue: with every thread waiting for a lock this thread holds, never)
        if not isinstance(sys.exc_info()[1], (KeyboardInterrupt, SystemExit)):
            futures.wait([f for f in self._futures if not f.cancelled()])
        if not _KEPT[0] and not _HOLDERS.get(self._n):  # (no loader holds it: none stays)
            with _GUARD:
                pool = None if _HOLDERS.get(self._n) else _POOLS.pop(self._n, None)
            if pool is not None:
                _let_go(pool)


def tag_item(e: BaseException, j: int | None) -> None:
    """Marks ``e`` as raised by the ``j``-th of the items a source was asked for, for the
    batch maker's message, which names that record (``item_of``); ``None``: by none of them
    (a source that read other records for them: a packing's)."""
    try:
        e.jaxloader_item = j  # type: ignore[attr-defined]
    except AttributeError:  # (an exception that takes no attribute: the batch is named)
        pass


def item_of(e: BaseException) -> int | None:
    """``tag_item``'s ``j`` of ``e``, if any."""
    j = getattr(e, "jaxloader_item", None)
    return j if isinstance(j, int) else None


def each(read: Callable[[Any], T], items: Sequence[Any],
         failed: Callable[[int, Exception], Exception] | None = None,
         located: Callable[[int, JaxloaderError], JaxloaderError] | None = None) -> list[T]:
    """``[read(item) for item in items]``, on this thread's read threads (``count``); a read
    that raises is raised in ``items``' order, as ``failed(j, error)`` (its cause the error)
    when given, else as it is, marked with ``j`` (``tag_item``); ``JaxloaderError``s as they
    are, or as ``located(j, error)`` makes them (the item they are about said)."""
    n = count()
    reads = Reads(read, items, current()) if n > 1 and len(items) > 1 else None
    out: list[T] = []
    try:
        for j, item in enumerate(items):
            try:
                out.append(read(item) if reads is None else reads[j])
            except JaxloaderError as e:
                if located is None:
                    raise
                raise located(j, e)
            except Exception as e:
                if failed is None:
                    tag_item(e, j)
                    raise
                raise failed(j, e) from e
    finally:
        if reads is not None:
            reads.close()
    return out
