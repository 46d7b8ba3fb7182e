"""The device-put thread: host batches in, device batches out, ``depth`` ready ahead.

::

    host batches (engine) ──> thread: put(batch) ──> block_until_ready ──> ready queue ──> next()
                               ^ acquires one of `depth` permits         consumer releases one ┘

At most ``depth`` batches are ahead of the consumer (made, being copied, or ready on device).
The thread drops its references to a host batch once the copy is done; the shared-memory slot
under it returns to the ring when nothing else reads it (on the CPU backend ``device_put`` may
keep the host memory as the device buffer, and then the slot stays out for as long as the device
array lives: a held array never changes). An exception in the thread reaches the consumer,
unchanged, at the batch where it happened.

Example:
    >>> p = DevicePrefetcher(iter([1, 2, 3]), put=lambda b: b * 10, depth=2)
    >>> [p.next() for _ in range(3)]
    [10, 20, 30]
    >>> p.close()
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator

_JOIN_TIMEOUT_S = 10.0  # the thread may be finishing one batch (a worker's, a device copy)
_END = object()


class DevicePrefetcher:
    """Runs ``put`` over ``host_batches`` in a thread; ``next()`` returns them in order."""

    def __init__(self, host_batches: Iterator[Any], put: Callable[[Any], Any], depth: int) -> None:
        self._host_batches = host_batches
        self._put = put
        self._permits = threading.Semaphore(depth)
        self._ready: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._run, name="jaxloader-device-put",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import jax

        try:
            while True:
                self._permits.acquire()
                if self._stop.is_set():
                    return
                host = next(self._host_batches, _END)
                if host is _END:
                    self._ready.put((_END, None))
                    return
                device = jax.block_until_ready(self._put(host))
                del host  # the copy is done: the host memory may be reused
                self._ready.put((device, None))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self._ready.put((None, e))
        finally:
            close = getattr(self._host_batches, "close", None)
            if close is not None:
                close()  # in this thread, which ran it: returns its slots to the ring

    def next(self) -> Any:
        """The next device batch; raises StopIteration at the end, or the thread's error."""
        if self._finished:
            raise StopIteration
        device, error = self._ready.get()
        if error is not None:
            self._finished = True
            raise error
        if device is _END:
            self._finished = True
            raise StopIteration
        self._permits.release()
        return device

    def close(self) -> None:
        """Stops the thread (after the batch it is making) and waits for it. Idempotent."""
        self._stop.set()
        self._permits.release()  # wakes a thread waiting for a permit
        if self._thread is not threading.current_thread():
            self._thread.join(_JOIN_TIMEOUT_S)
