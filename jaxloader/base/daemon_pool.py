"""``DaemonPool``: a pool of daemon threads running calls, each answered by a ``Future``.

The read threads (``base.read_threads``) run a source's reads, and a read may never return (a
file on a network filesystem whose server went away, a bucket that stopped answering).
``concurrent.futures.ThreadPoolExecutor``'s threads are joined as the interpreter exits, so
one such read kept the training process from ending, after ``close()`` and after a Ctrl-C,
without a word; the standard library offers no daemon pool. These threads are daemons: the
process ends with a read under way, as it does with the device-put thread's. The rest is the
executor's contract, kept: ``submit`` returns a ``concurrent.futures.Future`` (``cancel``,
``wait`` and ``result`` as for the executor's), threads start as work comes up to ``n``, and
``shutdown()`` ends them once the calls submitted before it are done, without waiting for them.

Example:
    >>> pool = DaemonPool(2, "example")
    >>> [f.result() for f in [pool.submit(pow, 2, k) for k in range(4)]]
    [1, 2, 4, 8]
    >>> pool.shutdown()
    >>> pool.submit(pow, 2, 5)
    Traceback (most recent call last):
    ...
    jaxloader.base.daemon_pool.PoolShut: DaemonPool example: submit after shutdown
"""

from __future__ import annotations

import concurrent.futures as futures
import queue
import threading
from typing import Any, Callable


class PoolShut(RuntimeError):
    """``submit`` after ``shutdown``."""


class DaemonPool:
    """Up to ``n`` daemon threads named ``{name}_{k}``, each running ``initializer()`` first."""

    def __init__(self, n: int, name: str, initializer: Callable[[], Any] | None = None) -> None:
        self._n, self._name, self._initializer = n, name, initializer
        self._work: queue.SimpleQueue = queue.SimpleQueue()  # (future, fn, args), or None: end
        self._idle = threading.Semaphore(0)  # threads waiting for work
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._shut = False
        self._running = 0  # calls under way

    def submit(self, fn: Callable[..., Any], *args: Any) -> futures.Future:
        """Runs ``fn(*args)`` on a thread of the pool; raises ``PoolShut`` after
        ``shutdown()``, and the system's error where no thread can be started and none is
        there to take it (a container's process limit)."""
        with self._lock:
            if self._shut:
                raise PoolShut(f"DaemonPool {self._name}: submit after shutdown")
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._n:
                thread = threading.Thread(target=self._run, daemon=True,
                                          name=f"{self._name}_{len(self._threads)}")
                try:
                    thread.start()
                except RuntimeError as e:  # ("can't start new thread": the others take it)
                    if not self._threads:
                        raise RuntimeError(
                            f"{self._name}: could start none of its {self._n} threads ({e}): "
                            "the process is at its thread limit (a container's pids.max, "
                            "ulimit -u); ask for fewer (read_threads=) or raise the limit"
                        ) from e
                else:
                    self._threads.append(thread)
            future: futures.Future = futures.Future()
            self._work.put((future, fn, args))
        return future

    def busy(self) -> bool:
        """Whether a call is under way."""
        return self._running > 0

    def _ended(self) -> None:
        with self._lock:
            self._running -= 1

    def shutdown(self) -> None:
        """No more calls; each thread ends once the calls before are done (not waited for)."""
        with self._lock:
            self._shut = True
            self._work.put(None)  # (each thread that takes it puts it back for the next)

    def _run(self) -> None:
        if self._initializer is not None:
            self._initializer()
        while True:
            item = self._work.get()
            if item is None:
                self._work.put(None)
                return
            future, fn, args = item
            with self._lock:  # (busy() from before the call can start, not after)
                self._running += 1
            if not future.set_running_or_notify_cancel():  # (cancelled while queued)
                self._ended()
            else:
                try:
                    result = fn(*args)
                except BaseException as e:  # (the caller's to raise, as the executor's)
                    self._ended()  # (before the caller is told: busy() false once it is)
                    future.set_exception(e)
                else:
                    self._ended()
                    future.set_result(result)
                    del result  # (a batch's records not kept alive by an idle thread)
            del item, future, fn, args
            self._idle.release()
