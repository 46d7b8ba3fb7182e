"""How a pool's workers end: stopped together (``stop_all``: by ``close()``, at exit, or as the
pool is collected), by the process that made them alone (``owned``: a forked child's exit or
``close()`` leaves its parent's workers, batches and memory alone, ``forget_all``), and at exit
before their starters are closed (``at_end``), so that their own atexit hooks run.

Example:
    >>> closing = [False]
    >>> owned(-1, closing, print, "not this process's pool"); closing
    [True]
"""

from __future__ import annotations

import atexit
import functools
import os
import threading
import time
import weakref
from typing import Any, Callable

from jaxloader.base.interrupts import run_all
from jaxloader.workers.process import LEAVE_S, STOP_GRACE_S, WorkerProcess, log


def owned(owner: int, closing: list[bool], fn: Callable[..., Any], *args: Any) -> None:
    """``fn(*args)``, a pool's finalizer (at exit, or as the pool is collected), in the process
    that made the pool (``owner``), ``closing`` set first: a worker it kills is said to be
    closed, not dead (a thread still reading at exit blamed the out-of-memory killer); a forked
    child's exit leaves its parent's workers and memory alone."""
    closing[0] = True
    if os.getpid() == owner:
        fn(*args)


def at_end(pool: Any, fn: Callable[..., Any], *args: Any) -> weakref.finalize:
    """``pool``'s finalizer of ``fn(*args)``, run by its maker alone (``owned``), at exit
    before the workers' starters are closed (``_at_exit``)."""
    end = weakref.finalize(pool, owned, pool._owner, pool._closing, fn, *args)
    with _ENDS_LOCK:
        if not _ENDS:
            atexit.register(_at_exit)  # (after the starters' hook: run before it)
        _ENDS[:] = [e for e in _ENDS if e.alive] + [end]
    return end


_ENDS: list[weakref.finalize] = []  # the finalizers of the pools alive
_ENDS_LOCK = threading.Lock()


def _at_exit() -> None:
    """The pools' finalizers, at exit: run by ``weakref.finalize``'s own exit hook where
    it was made later than the starters' hook, and after it where earlier (a loader without
    workers, a ``tempfile.TemporaryDirectory`` made first): the starters were closed, their
    workers ended by their parent-death signal, without their atexit hooks. The newest first,
    as ``weakref.finalize`` runs them: a pool's workers stopped before its memory goes."""
    run_all(list(reversed(_ENDS)))  # (each, whatever one before it raises)


def forget_all(workers: list[WorkerProcess]) -> None:
    """Closes this process's copies of ``workers``' pipes and pidfds, reading nothing from
    them and telling them nothing: a forked child's ``close()`` drained its parent's batches
    from the pipes, and the parent waited for them for good."""
    for worker in workers:
        worker.conn.close()
        worker._close_sentinel()


def stop_all(workers: list[WorkerProcess], ring: Any = None) -> None:
    """Stops ``workers``, then closes the pool's slot ring (if given). Every step runs even if
    an earlier one is interrupted (``jaxloader.base.interrupts``, 4). The workers wind down
    together: told at once, given one grace (``STOP_GRACE_S``) between them to close their pipes
    (those that have not are killed), then each waited for as it ends."""
    deadline = time.monotonic() + STOP_GRACE_S

    def said() -> None:  # (a step: an exit code is asked of the starter, a round trip a Ctrl-C
        running = [w.pid for w in workers if w.exitcode() is None]  # may cut; a log handler
        if running:  # may raise): cut before the others ran, a collected loader's slots and
            log.info("stopping worker process(es) %s", running)  # pidfds stayed for good

    steps: list[Callable[[], Any]] = [said] + [w.ask_to_stop for w in workers]
    steps += [functools.partial(w.let_go, deadline) for w in workers]
    ends: list[float] = []  # (one wait for their ends, from the first reap: not one each)

    def reap(worker: WorkerProcess) -> Any:
        ends.append(ends[0] if ends else time.monotonic() + LEAVE_S)
        return worker.reap(ends[0])

    steps += [functools.partial(reap, w) for w in workers] + ([] if ring is None else
                                                              [ring.close])
    run_all(steps)
