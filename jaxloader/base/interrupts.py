"""Interrupt safety: what a Ctrl-C (``KeyboardInterrupt``) may and may not do, in one place.

The problem. Python raises ``KeyboardInterrupt`` (or whatever a signal handler raises) between
any two bytecodes of the main thread. A loader that is interrupted in the middle of its own
bookkeeping can lose a batch, hand out the same batch twice, leave half a message in a worker
pipe, leak a shared-memory segment or a worker, or hang the next call. In a notebook, where
interrupting a cell and running it again is routine, each of those is a bug a user meets.

What does not work: catching ``KeyboardInterrupt`` and carrying on (the user asked to stop);
masking signals around critical sections (the main thread would not react to a hung worker);
``__del__`` or ``weakref.finalize`` callbacks that run Python code when a batch dies (an
interrupt landing inside one is printed and swallowed).

The invariants the rest of the code keeps:

1. **Nothing is lost or repeated by ``next()``.** The position moves only after a batch is in
   hand, with no call between taking the batch and returning it (``iterator.LoaderIterator``),
   and only while its iterator is live (another thread's restore is not undone by it).
   An exception inside ``next()`` marks the iterator interrupted; the next ``next()`` stops what
   was in flight (waiting until the prefetch thread is gone: never two drivers) and makes the
   same step again. ``iter()`` and a restore wait for the old thread the same way.
2. **A message is whole or the pipes are not trusted.** An interrupt while blocked in
   ``poll()`` changes nothing; one anywhere else in a run may have cut a message in half, so the
   next run starts fresh workers (``workers.pool``, ``_mixed_up``).
3. **Everything owned is reachable by its owner before it can leak.** A segment enters its
   owner's registry in the same ``try`` that creates it, and a create cut short releases it by
   name or token (``workers.shm``); a thread is held by its owner, and the owner by the
   loader, before it starts (``sharding.prefetch``, ``LoaderIterator._start``); locks are C
   locks taken in ``with`` blocks, which leave no gap between taking and owning
   (``workers.pool``). The main thread never calls ``threading.Event``, ``Semaphore`` or
   ``Condition`` methods: they are Python code around a lock, and an interrupt inside
   ``Event.set()`` or ``Semaphore.release()`` leaves that lock held for good. It signals the prefetch thread through ``queue.SimpleQueue`` (C) instead.
4. **Shutdown runs to the end.** ``run_all`` runs every step of a shutdown even if one is
   interrupted, then raises the first interrupt: a loader's ``close()`` stops its iterator
   and then its engine (``lifecycle``), a pool its workers and then its ring; a second Ctrl-C
   while a worker drains kills it instead of waiting (``workers.process``). Every ``close()``
   runs every step again (each is idempotent), so one cut short before or between its steps
   is finished by the next; none runs through a ``weakref.finalize``, which runs only once.
5. **No Python code runs when a batch dies.** A slot returns to the ring through a weak
   reference whose callback is a builtin (``deque.append``), so an interrupt cannot land in it
   (``workers.ring``).
6. **Workers leave Ctrl-C to the main process.** Each is a process group of its own, which a
   terminal's Ctrl-C does not reach, does nothing on SIGINT, and exits when its pipe reports
   EOF (``workers.worker``).
7. **What must agree changes at once.** CPython runs a signal handler only at a function's
   start, just after a call returns and at a loop's back edge, never between two plain stores. So
   values that must agree are set in one statement with no call inside (a stream loader's
   step and its readers' states in ``load_state_dict``, a sampler's epoch and its shuffle, a
   memo's chunk and its rows), or in an order whose every prefix is sound (a row group's
   size before the row group in the cache, ``sources.parquet``).

The tests that hold the code to these: ``tests/test_interrupts.py`` (interrupts fired at random
into long runs, with and without workers and device prefetch), ``tests/test_interrupt_points.py``
(without workers, an interrupt at each point of ``next()``, ``peek()``, ``state_dict()``,
``iter()`` and ``load_state_dict()`` where one can land, in turn, for arrays, Parquet, mixtures,
packed rows and streams, with device prefetch too) and the interrupted-close and lost-message
tests in ``tests/workers/test_pool.py``.

Example:
    >>> done = []
    >>> def interrupted():
    ...     raise KeyboardInterrupt
    >>> try:
    ...     run_all([lambda: done.append(1), interrupted, lambda: done.append(3)])
    ... except KeyboardInterrupt:
    ...     print(done)
    [1, 3]
"""

from __future__ import annotations

from typing import Any, Callable


def run_all(steps: list[Callable[[], Any]]) -> None:
    """BatchRuns every step even if an earlier one raises (a Ctrl-C, say); then raises the first."""
    first: BaseException | None = None
    for step in steps:
        try:
            step()
        except BaseException as e:  # noqa: BLE001 - the remaining steps still run
            first = first or e
    if first is not None:
        raise first
