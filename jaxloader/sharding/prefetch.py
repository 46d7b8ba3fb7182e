"""Device prefetch: host batches made ahead in a thread, device copies made ahead.

::

    engine (workers or in-process) ──> host thread ──(queue, `depth` ahead)──┐
                                       [put(host) here: one device]          │
    next() ── [many devices: in the caller's thread, dispatch put(host) for the next batches]
              keep `depth` device batches ready beside the one returned, the oldest

Where the copy is made depends on the sharding:

- One device, one process (a single GPU, a Colab runtime): the thread places each batch
  (``put_in_thread=True``), so ``next()`` only takes a ready device batch. No collective can
  be waiting on that device, and taking the copy's cost off the training thread matters on
  the CPU backend, where a ``device_put`` after the thread sat idle costs a wake-up.
- Several devices or processes: JAX calls stay in the thread that runs the training step. On
  JAX's CPU backend a ``device_put`` issued from another thread while a multi-device step waits
  in a collective deadlocks the collective's rendezvous (an all-reduce hangs for good);
  issued from the caller's thread the copies are ordered with the
  steps. ``jax.device_put`` is asynchronous, so on an accelerator the copy of batch
  N+``depth`` overlaps the step on batch N.

Bounds: ``depth`` placed batches waiting (thread placing), or ``depth`` device copies in flight
after the one handed out and ``depth + 1`` host batches made ahead of them (caller placing).
Once placed, the host batch is dropped: JAX keeps the host memory alive until its copy is done
(or, on CPU, for as long as the device array aliases it), so the shared-memory slot returns to
the ring only when nothing reads it. An exception from the host side or from ``put`` reaches
the consumer, unchanged, after the batches before it.

Staying out of the way: when the consumer takes a batch while another is still ready, it is
about to free its previous batch and dispatch a step, which needs a core and the GIL for a
fraction of a millisecond. The thread (and the worker it hands the next task to) would compete
for exactly those, so it waits ``_BACK_OFF_S`` first, or until the consumer asks again,
whichever is sooner. When no batch is ready the
thread never waits.

Example:
    >>> p = DevicePrefetcher(iter([1, 2, 3]), put=lambda b: b * 10, depth=2).start()
    >>> [p.next() for _ in range(3)]
    [10, 20, 30]
    >>> p.close()  # the thread is gone
    True
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import math
import os
import queue
import sys
import threading
import time
import traceback
import warnings
import weakref
from typing import Any, Callable, Iterator

from jaxloader.base.abilities import close_of
from jaxloader.batching.jit_cpu import CARRIED
from jaxloader.base.errors import JaxloaderError, JaxloaderWarning, user_stacklevel
from jaxloader.engines.stall_watch import look_all

# close() waits this long for the thread, which may be finishing a batch (then left to end by
# itself: a worker's batch ends when close() kills the workers; an in-process one when made)
_JOIN_TIMEOUT_S = 0.2
_POLL_S = 0.1  # while waiting for the thread's end: how often to look again without a wake-up
_BACK_OFF_S = 0.001  # see "Staying out of the way"; covers a step's dispatch, not a step
_FIRST_LOOK = 0.1  # seconds get() waits before it looks for a late batch made in process
_END = object()
_STOP = object()
_MANY_PLACED = 32  # batches kept placed ahead past which device_prefetch= is warned of
_STOPPED = object()  # the thread's last word on ``_ready``: a get() waiting then is not left


class Stopped(JaxloaderError):
    """``get()`` found the thread stopped by ``stop()`` from another thread: its iterator is
    stale (the loader's own error says so)."""


def _drain(q: queue.SimpleQueue) -> list:
    """What ``q`` holds now, taken out of it."""
    items = []
    while True:
        try:
            items.append(q.get_nowait())
        except queue.Empty:
            return items


class HostPrefetcher:
    """BatchRuns ``host_batches`` (and ``put`` on each batch, when given) in a thread, at most
    ``depth`` batches ahead of ``get()``."""

    def __init__(self, host_batches: Iterator[Any], depth: int,
                 put: Callable[[Any], Any] | None = None) -> None:
        self._host_batches = host_batches
        self._put = put  # applied in the thread to each batch, when given
        # The consumer's side touches only SimpleQueues (C: a put or a get is whole, or not
        # done) and one attribute. A Ctrl-C inside threading.Event.set() or
        # Semaphore.release() can leave their lock held for good, and the thread and the next next() would then wait on it forever.
        self._permits: queue.SimpleQueue = queue.SimpleQueue()  # a batch the thread may make
        for _ in range(depth):
            self._permits.put(None)
        self._ready: queue.SimpleQueue = queue.SimpleQueue()
        self._taken: queue.SimpleQueue = queue.SimpleQueue()  # get(): the consumer came
        self._stopping = False
        # The thread's end, told by the thread itself (its last act: a flag, then a wake-up),
        # and waited for here rather than by Thread.join: on Python 3.11 a join interrupted
        # (Ctrl-C) while the thread runs marks it stopped (it releases the lock the running
        # thread holds), and every later join and is_alive() then says it is gone while it
        # still drives the engine, beside the next run's thread (under repeated interrupts
        # they piled up, each waiting on the engine the others held). The flag is the truth:
        # a wake-up taken by a get() that an interrupt cut short just after it returned is
        # lost, and the wait times out and looks again.
        self._ended: queue.SimpleQueue = queue.SimpleQueue()
        self._launched = self._finished = False
        self.owner = os.getpid()  # (a forked child has the queues, not the thread)
        # the batches made and placed under the JAX settings of the thread that made this one
        # (they were 32-bit in a `with jax.enable_x64(True):` block; device_prefetch=0's not)
        self._jax_settings = _jax_here()
        self._thread = threading.Thread(target=self._run, name="jaxloader-host-prefetch",
                                        daemon=True)

    def start(self) -> None:
        """Starts the thread; apart from ``__init__`` so that its owner holds it first."""
        self._launched = True  # (before: an interrupt in start() may come once it runs)
        _RUNNING.add(self)
        atexit.unregister(_close_at_exit)  # (the newest hook runs first: before JAX's own,
        atexit.register(_close_at_exit)  # registered as it started, and any later one)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.ExitStack() as settings:
            for name, value in self._jax_settings.items():
                settings.enter_context(getattr(sys.modules["jax"], name)(value))
            self._loop()

    def _loop(self) -> None:
        try:
            while True:
                if self._permits.get() is _STOP or self._stopping:
                    return
                if self._back_off() or self._stopping:
                    return
                host = next(self._host_batches, _END)
                if host is not _END and self._put is not None:
                    host = self._put(host)
                self._ready.put((host, None))
                if host is _END:
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, in order
            self._ready.put((None, e))
        finally:
            try:
                close_of(self._host_batches)  # in this thread, which ran it: returns its slots to the ring
            finally:
                self._finished = True
                self._ended.put(None)
                # A consumer waiting in get() as the thread stopped (its loader closed or
                # restored from another thread) waited for good: it is told; what it made for
                # a stopped run goes (a batch finished after close() stopped waiting for it
                # held its device memory while the closed loader's iterator lived)
                if self._stopping:
                    _drain(self._ready)
                self._ready.put((_STOPPED, None))

    def _back_off(self) -> bool:
        """After the consumer took a batch: waits ``_BACK_OFF_S`` while another is still
        ready, unless the consumer asks again sooner (see the module docstring). True if
        told to stop meanwhile."""
        taken = _drain(self._taken)
        if not taken:
            return False  # filling up, not woken by a take: no step is starting
        if _STOP in taken:
            return True
        if not self._ready.empty():  # checked after the drain: a get() in between ends the wait
            try:
                taken = [self._taken.get(timeout=_BACK_OFF_S)]
            except queue.Empty:
                return False
            taken += _drain(self._taken)  # a take that ended the wait: a fast consumer, fill up
            return _STOP in taken
        return False

    def ready(self) -> bool:
        """True if ``get()`` would not wait."""
        return not self._ready.empty()

    def get(self) -> tuple[Any, BaseException | None]:
        """``(next host batch or _END, None)``, or ``(None, the thread's error)``; while it
        waits, a batch made in process and late is said (``look_all``)."""
        pause: float | None = _FIRST_LOOK  # (a batch within it: nothing looked at)
        while True:
            try:
                host, error = self._ready.get(timeout=pause)
                break
            except queue.Empty:  # (a timeout: a late batch of this process's said, and
                pause = look_all()  # again after the pause it gives; none live: none)
        if host is _STOPPED:
            self._ready.put((_STOPPED, None))  # (for a later get() too)
            raise Stopped("the device-put thread was stopped (its loader closed, restored or "
                          "iterated again from another thread) while this call waited")
        if error is None and host is not _END:
            self._taken.put(None)  # before the permit: the woken thread must see the take
            self._permits.put(None)
        return host, error

    def stop(self) -> None:
        """Tells the thread to stop after the batch it is making; returns at once. Safe to
        interrupt: the first put alone stops the thread (after the permits before it)."""
        self._permits.put(_STOP)  # wakes a thread waiting for a permit
        self._taken.put(_STOP)  # or backing off
        self._stopping = True  # or about to make a batch, with permits left
        # and a consumer waiting in get() now: the thread says so as it ends, but one blocked
        # in its source (a generator waiting on a queue) never ends its batch to say it
        self._ready.put((_STOPPED, None))

    def close(self, until_gone: bool = False, by: float | None = None) -> bool:
        """Stops the thread (after the batch it is making) and waits for it, at most
        ``_JOIN_TIMEOUT_S`` (or until ``time.monotonic()`` is ``by``, or ``until_gone``);
        whether it is gone. Idempotent. In a forked child the thread is not there: none to wait
        for (an iter() there waited for good on a copy of the parent's)."""
        self.stop()
        if not self._launched or os.getpid() != self.owner:
            return True
        if self._thread is threading.current_thread():
            return False
        deadline = None if until_gone else by if by is not None else (
            time.monotonic() + _JOIN_TIMEOUT_S)
        say_at = time.monotonic() + SAY_WAIT_S
        while not self._finished:
            if self._thread.ident is None and not self._thread.is_alive():
                return True  # (start() interrupted before the thread ran: none to wait for)
            if deadline is None and time.monotonic() >= say_at:
                say_at = math.inf
                _said_waiting(self._thread)
            left = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            if left <= 0:
                return False
            try:
                self._ended.get(timeout=left)
            except queue.Empty:
                pass
        # Its code is done: the join only waits for the thread's teardown (and, interrupted
        # now, marks nothing that still runs)
        self._thread.join(_POLL_S)
        _drain(self._ready)  # (the batches made for no one: placed ones held device memory
        self._ready.put((_STOPPED, None))  # while an iterator of the closed loader lived)
        return True


def _said_waiting(thread: threading.Thread) -> None:
    """Warns that a new run (``iter()``, ``load_state_dict()``) waits for the device-put
    thread of the run before, which has made a batch ahead for ``SAY_WAIT_S`` (it reads the
    source, which the next run reads from its own place: it must end first); where it is."""
    frame = sys._current_frames().get(thread.ident or -1)
    at = "".join(traceback.format_stack(frame)[-8:]) if frame is not None else ""
    warnings.warn(
        f"iter(), load_state_dict() or a restart after Ctrl-C waits for the device-put "
        f"thread of the run before, which has been making a batch ahead for {SAY_WAIT_S:.0f} "
        "s (the next run may read the source only once it ends). A batch slow to make (a "
        "first compilation, workers starting) ends by itself; a source that waits for data "
        "the training loop gives after this call (a queue it fills) never does: give the "
        "data first, or device_prefetch=0 (no batch read ahead of next()). It is at:"
        f"\n{at}", JaxloaderWarning, stacklevel=user_stacklevel())


SAY_WAIT_S = 10.0  # a new run's wait for the run before's device-put thread, then said


def _jax_here() -> dict[str, Any]:
    """This thread's JAX settings that a batch made or placed depends on (those carried to the
    workers, ``jit_cpu.CARRIED``) where they are set here alone (``with jax.enable_x64(True):``
    around ``iter()``), each by its context manager's name; the thread follows the global
    setting of the others, as it changes."""
    jax = sys.modules.get("jax")
    here: dict[str, Any] = {}
    for name in CARRIED if jax is not None else ():
        state: Any = getattr(jax, name.removeprefix("jax_"), None)  # (a JAX without it)
        if hasattr(state, "get_global") and state.value != state.get_global():
            here[name.removeprefix("jax_")] = state.value
    return here


_RUNNING: weakref.WeakSet[HostPrefetcher] = weakref.WeakSet()


def _close_at_exit() -> None:
    """The threads of loaders left open as the interpreter exits, stopped and their placed
    batches let go while JAX's runtime is whole: a batch placed on devices from the thread,
    still queued as the interpreter tore down, aborted the process after the script's work was
    done ("terminate called...", exit code 134: a finished run marked failed)."""
    running = [p for p in _RUNNING if p.owner == os.getpid()]  # (a forked child has none)
    for prefetcher in running:
        prefetcher.stop()
    deadline, failed = time.monotonic() + _JOIN_TIMEOUT_S, []  # (one wait for them all)
    for prefetcher in running:
        try:
            prefetcher.close(by=deadline)
        except Exception as e:  # noqa: BLE001 - the others closed first, then raised
            failed.append(e)
        finally:  # (what was placed, where the thread is still making a batch too)
            _drain(prefetcher._ready)
    if failed:
        raise failed[0]


class DevicePrefetcher:
    """``next()`` returns ``put(batch)`` in order, ``depth`` batches ahead; ``put`` runs in
    the thread with ``put_in_thread``, else in the caller's ``next()``."""

    def __init__(self, host_batches: Iterator[Any], put: Callable[[Any], Any], depth: int,
                 put_in_thread: bool = False) -> None:
        # started by start(); with put_in_thread it places the batches too; else one host batch
        # more, ready to place as the caller takes one (``depth`` then stay placed ahead)
        if depth > _MANY_PLACED:  # (100,000 was taken: the devices' memory filled, unsaid)
            warnings.warn(
                f"device_prefetch={depth}: that many batches are placed on the devices ahead of "
                "the step, each holding its device memory (an accelerator runs out of it with "
                "no word of why); 2 hides a placement, a few more a jittery one", JaxloaderWarning,
                stacklevel=user_stacklevel())
        self._host = HostPrefetcher(host_batches, depth if put_in_thread else depth + 1,
                                    put if put_in_thread else None)
        self._put = put
        self._depth = depth
        self._put_in_thread = put_in_thread
        self._in_flight: collections.deque = collections.deque()
        self._pending: BaseException | None = None  # raised once the batches before it are out
        self._ended = False
        # Dropped without close() (a loop broken out of, then its loader deleted): the thread,
        # which holds the host batches and so the workers, must not wait for a taker forever.
        weakref.finalize(self, self._host.stop)

    def next(self) -> Any:
        """The next device batch; raises StopIteration at the end, or the host side's error."""
        if os.getpid() != self._host.owner:  # (it waited for good for a thread it has not)
            raise JaxloaderError(
                f"this loader's device-put thread runs in process {self._host.owner}, which "
                f"forked this one ({os.getpid()}): a forked process cannot use it; make a "
                "loader in it, and leave the parent's loader to the parent")
        if self._put_in_thread:
            return self._next_placed()
        # (depth placed ahead of the one handed out: the depth of one device, the docs')
        while len(self._in_flight) <= self._depth and not self._ended and self._pending is None:
            if self._in_flight and not self._host.ready():
                break  # do not wait for a batch that is not needed yet
            host, error = self._host.get()
            if error is not None:
                self._pending = error  # delivered after the batches before it
            elif host is _END:
                self._ended = True
            else:
                try:
                    self._in_flight.append(self._put(host))
                except Exception as e:  # noqa: BLE001 - a Ctrl-C here is raised at once
                    self._pending = e
                del host  # dispatched: JAX holds the host memory until the copy is done
        if self._in_flight:
            return self._in_flight.popleft()
        if self._pending is not None:
            raise self._pending
        raise StopIteration

    def _next_placed(self) -> Any:
        """``next()`` when the thread places the batches: they come ready, in order."""
        if self._pending is None and not self._ended:
            batch, error = self._host.get()
            if error is not None:
                self._pending = error
            elif batch is _END:
                self._ended = True
            else:
                return batch
        if self._pending is not None:
            raise self._pending
        raise StopIteration

    def start(self) -> "DevicePrefetcher":
        self._host.start()
        return self

    def close(self, until_gone: bool = False) -> bool:
        """Stops the host thread (see ``HostPrefetcher.close``; whether it is gone) and drops
        the batches in flight. Idempotent."""
        gone = self._host.close(until_gone)
        self._in_flight.clear()
        return gone
