"""The worker process: make the batches it is asked for, straight into shared-memory slots.

::

    start ──> the kernel ends it with its parent (die_with_parent), whatever it runs then
    Init ──> set sys.path and argv (ties.py), the trainer's logging levels and warning
             filters (relay.py), its status row, loads(payload), init_fn(id)
    Task ──> [maker.reset(task.reset)] for each of its steps: status.making(step), then
                                              maker.make(step, alloc=its slot)
                                              (the heap keeps a batch's freed pages: heap.py)
                                              (Grow ... Slot when it needs more room)
         ──> [Said: what its code logged and warned] Done (a Made tuple a step, + reports)
         └─> a step that raises: Done for the steps before it, Failed (exception, traceback)
    Stop / EOF ──> exit (``run``: hooks, threads and streams seen to, no module teardown)

The messages are in ``jaxloader.workers.protocol``.

The pipe is the link: when the main process closes it, ``recv`` sees EOF and the worker exits.
A worker inside user code (a long transform, a generator that blocks) reads no pipe: the kernel
ends it when the main process dies (Linux's parent-death signal, asked for before any user
code runs; elsewhere a watchdog thread). Ctrl-C in the terminal is left to the main process
(a worker is a process group of its own, and does nothing on SIGINT). The worker writes the
step it starts into its status row first (``status.py``): a worker that dies is named with
the step it died in. The worker never imports JAX and never unlinks a segment.
"""

from __future__ import annotations

import atexit
import importlib
import errno
import os
import pickle
import sys
import threading
import time
from collections import OrderedDict, deque
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from jaxloader.base.timings import SLOT_WAIT, StageClock
from jaxloader.base.tree import flatten, is_flat_dict
from jaxloader.batching import jit_cpu
from jaxloader.engines.in_process import Maker, StreamMaker
from jaxloader.workers import payload, protocol, relay_worker, ties
from jaxloader.runtime import shm, worker_info
from jaxloader.runtime.descriptors import out_of_descriptors
from jaxloader.runtime.worker_info import WorkerInfo
from jaxloader.workers.heap import Heap
from jaxloader.workers.protocol import SKIPPED, Done, Grow, Slot, Stop, Task
from jaxloader.workers.status import WorkerStatus
from jaxloader.workers.tasks import ahead_slots

# slot mappings kept per worker: more than a ring holds in steady state, and no more than it
# may hold (``tasks.ahead_slots``: a quarter of the descriptor limit; a mapping holds one
# before Python 3.13)
_MAX_MAPPED = 128
_UNUSED = 256  # slots given since a mapping was last used, past which it is let go


class _Slots:
    """The worker's mappings of slots by name, most recent last; at most ``_MAX_MAPPED``, none
    unused for ``_UNUSED`` slots given (the ring lets its free slots past the most in use lately
    go: a mapping kept their memory, 60 MB of 2 workers after a kept pass was dropped), none
    smaller than the largest slot given (the ring destroys smaller ones, whose memory a mapping
    kept alive: a worker held 2.6 GB of slots the ring had let go, against a ring of 720 MB),
    and once the ring comes down after an outlier (``SlotRing._settle``: a slot given under half
    the largest) none over twice the slot given."""

    def __init__(self) -> None:
        self._maps: OrderedDict[str, Any] = OrderedDict()
        self._largest = 0  # the largest slot given: smaller ones are not given again
        self._most = min(_MAX_MAPPED, ahead_slots())
        self._gets = 0  # slots given so far, and each mapping's last (a name -> the count)
        self._used: dict[str, int] = {}

    def get(self, name: str, size: int) -> memoryview:
        mapped = self._maps.pop(name, None)
        if mapped is None or len(mapped) < size:
            mapped = self._attach(name, size)
        if size > self._largest or 2 * size < self._largest:  # (grown, or come down)
            self._largest = size
            for other in [n for n, m in self._maps.items() if len(m) < size or len(m) > 2 * size]:
                self._close(other)
        self._maps[name] = mapped
        self._gets += 1
        self._used[name] = self._gets
        while len(self._maps) > self._most or self._used[next(iter(self._maps))] < (
                self._gets - _UNUSED):  # (slots the main process replaced or retired: its
            self._close(next(iter(self._maps)))  # ring lets the free ones past the most in
        return memoryview(mapped)[:size]  # use lately go, whose memory a mapping kept)

    def _attach(self, name: str, size: int) -> Any:
        """``shm.attach``; where the address space (``ulimit -v``) or the descriptor table is
        full, again once the other mappings are let go (those kept for later reuse may be what
        fills it), else the error that names the limit (it was a bare ``Errno 12``)."""
        try:
            return shm.attach(name, size)
        except OSError as e:
            if e.errno not in (errno.ENOMEM, errno.EMFILE):
                raise
            for other in list(self._maps):
                self._close(other)
            try:
                return shm.attach(name, size)
            except OSError as again:
                if again.errno == errno.EMFILE:
                    raise out_of_descriptors(again, "a batch slot in a worker") from e
                raise shm.unmappable(size, again) from e

    def _close(self, name: str) -> None:
        mapped = self._maps.pop(name)
        self._used.pop(name, None)
        try:
            mapped.close()
        except BufferError:  # (a view of it still alive: unmapped as it dies)
            pass


class _Stopped(SystemExit):
    """Told to stop while a step waits for its slot: the worker's end, not a failure."""


class _Inbox:
    """Messages from the main process; those that arrive while a batch waits for a bigger
    slot are kept for later, in order."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._pending: deque = deque()

    def next(self) -> Any:
        return self._pending.popleft() if self._pending else protocol.receive(self.conn)

    def wait_for_slot(self, task_id: int, nth: int) -> Slot:
        while True:
            message = protocol.receive(self.conn)
            if type(message) is Slot and (message.task_id, message.nth) == (task_id, nth):
                return message
            if type(message) is Stop:
                raise _Stopped(0)
            self._pending.append(message)


class _Lease:
    """The slot a task's step writes into; ``alloc`` asks the main process for a bigger one if
    needed."""

    def __init__(self, task_id: int, nth: int, name: str, size: int, inbox: _Inbox,
                 slots: _Slots, clock: StageClock) -> None:
        self.task_id, self.nth, self.name, self.size = task_id, nth, name, size
        self._inbox, self._slots, self._clock = inbox, slots, clock
        self.used = 0

    def alloc(self, nbytes: int) -> memoryview:
        self.used = nbytes
        if nbytes > self.size:
            start = time.perf_counter()
            relay_worker.send(self._inbox.conn, Grow(self.task_id, self.nth, nbytes))
            _, _, self.name, self.size = self._inbox.wait_for_slot(self.task_id, self.nth)
            self._clock.add(SLOT_WAIT, time.perf_counter() - start)  # (collation's too)
        return self._slots.get(self.name, self.size)[:nbytes]


class _Piped:
    """Which leaves of a batch travel by pipe (strings, objects: not in the slot), worked out
    once a layout."""

    def __init__(self) -> None:
        self._layout: Any = None
        self._which: list[int] = []  # the layout's leaves sent by pipe
        self._flat = False  # whether its batch is a flat dict (its leaves: no tree walk)

    def objects(self, batch: Any, layout: Any) -> list:
        if layout is not self._layout:
            self._layout, self._flat = layout, is_flat_dict(layout.treedef)
            self._which = [i for i, spec in enumerate(layout.leaves) if spec.offset < 0]
        if not self._which:
            return []
        leaves = list(batch.values()) if self._flat else flatten(batch)[0]
        return [leaves[i] for i in self._which]


def _start(conn: Connection) -> tuple[Maker, WorkerStatus] | None:
    """The payload received and loaded, ``worker_init_fn`` run: the maker and this worker's
    status row; ``None`` when told to stop first or when that failed (reported)."""
    # NumPy imports numpy.ma the first time np.unique runs, which a
    # read-local order or a Parquet join calls in the first batch: imported here instead,
    # while the main process prepares the payload (JAX's import does it in the main process)
    importlib.import_module("numpy.ma")
    init = protocol.receive(conn)
    if type(init) is Stop:  # stopped before its payload came (a start cut short by Ctrl-C)
        return None
    path, worker_id, num_workers, seed, blob, status_names, argv, told, capacity = init
    sys.path[:] = path
    ties.take_the_trainers(argv)
    try:
        relay_worker.take(told, worker_id, conn)
        ties.hold_signals_across_forks()  # (its hook after the relay's)
        status = WorkerStatus(status_names, worker_id, crash_dumps=True)
        worker_info.set_info(WorkerInfo(worker_id, num_workers, seed), capacity)  # (a source
        maker: Maker  # may ask as it is unpickled)
        maker, init_fn = relay_worker.imported(lambda: payload.loads(blob))
        if init_fn is not None:
            relay_worker.run_init(init_fn, worker_id)
    except BaseException as e:  # noqa: BLE001 - reported, then this worker ends
        relay_worker.send_kept(conn, wait=True)
        relay_worker.send(conn, protocol.failed(-1, None, e))
        return None
    status.idle()
    return maker, status


def serve(conn: Connection) -> None:
    """The worker loop; returns when told to stop or when the main process is gone, a
    stream's shards closed (left to the collector, each warned ``ResourceWarning``: an error
    under ``-W error``)."""
    started = _start(conn)
    if started is None:
        return
    try:
        _serve_tasks(conn, *started)
    finally:
        close = getattr(started[0], "close", None)
        if callable(close):
            close()


def _serve_tasks(conn: Connection, maker: Maker, status: WorkerStatus) -> None:
    inbox, slots, heap, piped = _Inbox(conn), _Slots(), Heap(), _Piped()
    last_layout = None
    stream = maker if isinstance(maker, StreamMaker) else None  # its readers' states reported
    clock: StageClock = getattr(maker, "clock", None) or StageClock()
    while True:
        message = inbox.next()
        if type(message) is not Task:  # Stop
            return
        began, cpu_began = time.perf_counter(), time.process_time()
        since = time.monotonic()  # (one clock for every process)
        task_id, first, stride, named, reset, trace, run = message
        if (clock.trace is not None) != trace:
            clock.trace = [] if trace else None
        leases = [_Lease(task_id, nth, name, size, inbox, slots, clock)
                  for nth, (name, size) in enumerate(named)]
        steps = [first + nth * stride for nth in range(len(leases))]
        made: list[tuple] = []
        failed = batches = None
        for nth, (step, lease) in enumerate(zip(steps, leases)):
            if status.stale(run):  # a restore, an iter(), a Ctrl-C since: nobody waits for it
                made.extend((k, SKIPPED, None, None) for k in range(nth, len(leases)))
                break
            status.making(step)  # (a task read at once: its first step names the read)
            try:
                if batches is None:
                    if stream is not None and reset is not None:  # from the loader's place
                        stream.reset(reset)
                    batches = maker.make_steps(steps, [each.alloc for each in leases])
                batch, layout = next(batches)
                report = stream.report() if stream is not None else None
                heap.fit(lease.used)  # the next batch's records reuse this one's freed pages
            except _Stopped:
                return  # (a transform's own sys.exit() is a failure, reported below)
            except BaseException as e:  # noqa: BLE001 - everything goes back to the main process
                failed = protocol.failed(task_id, step, e)
                break
            objects = piped.objects(batch, layout)  # strings/objects travel by pipe
            del batch  # drop the views of the slot before the main process may reuse it
            made.append((nth, None if layout == last_layout else layout, objects, report))
            last_layout = layout
        batches = None  # (a task left or failed: its reads in flight end, the rest not read)
        status.idle()
        # The timings ride on every Done (jaxloader.base.timings): no message of their own,
        # and none held back (the main process reads a Done only as it needs its batches: a
        # loop paused after a few had their timings in a Done it never read, and diagnose()
        # blamed the training process for a busy worker); stamped with when the task began
        # (timings from before a reset of the stats are dropped)
        busy = time.perf_counter() - began
        timings = (busy, time.process_time() - cpu_began, *clock.take(busy), since)
        relay_worker.send_kept(conn, wait=True)  # (what the steps said: before them)
        relay_worker.said_again()
        sent = _send_made(conn, task_id, first, stride, made, timings)
        if not sent or failed is not None:
            last_layout = None  # the main process may not hold the last layout sent
        if sent and failed is not None:  # (a batch that could not be sent failed the task)
            relay_worker.send(conn, failed)


def _send_made(conn: Connection, task_id: int, first: int, stride: int, made: list,
               timings: tuple | None) -> bool:
    """Sends ``Done`` for ``made``; a batch that cannot be pickled (not even by value) is
    reported as its step's failure, after the batches before it (and ``False`` returned)."""
    if not made:
        return True
    try:
        relay_worker.send(conn, Done(task_id, tuple(made), timings))
        return True
    except (pickle.PicklingError, AttributeError, TypeError):
        pass
    for one in made:  # which one: sent one by one, up to the one that fails
        try:
            relay_worker.send(conn, Done(task_id, (one,), timings if one is made[0] else None))
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            relay_worker.send(conn, protocol.failed(task_id, first + one[0] * stride, e))
            return False
    return True


def run(fd: int, parent: int) -> NoReturn:
    """An ``"exec"`` worker's whole life, exec'd or forked from the starter: ``main``, then
    ``leave``. An exception out of ``main`` (a defect of ours) goes to the interpreter, which
    prints its traceback and exits with 1."""
    main(fd, parent)
    leave()


def leave() -> NoReturn:
    """Ends this process as Python's exit does, less the teardown of its modules: threads
    shut down as the interpreter shuts them down (``threading._shutdown``, which
    ``multiprocessing``'s children call too: an executor left open is woken, every non-daemon
    thread joined), then the atexit hooks (a user's ``worker_init_fn`` may register one), then
    Python's and C's buffered output flushed, then ``os._exit``: 0, or 120 if the output could
    not be written, as Python exits then. Tearing down the hundreds of modules a worker holds
    (NumPy's, jaxloader's, JAX's with a ``JitMap``) cost more CPU than a worker's start from
    the starter, at every loader's close (docs/benchmarks.md, "A loader's start"). What that
    skips: objects still alive are not finalized, so a file a transform keeps open is not
    flushed at the end (write it in a ``with`` block)."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    relay_worker.spill()
    code = 0
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # (ValueError: closed by the user's code)
            code = 120
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)  # (C's stdio: printf from an extension)
    except (OSError, AttributeError):
        pass
    os._exit(code)


def main(fd: int, parent: int) -> None:
    """Entry point of a worker: ``fd`` is its end of the pipe to the main process, ``parent``
    that process's pid."""
    jit_cpu.IN_WORKER = True  # (its JitMaps' XLA sized to its share of the cores, donating)
    ties.die_with_parent(parent)
    ties.gone_before_the_trainer()
    ties.leave_signals_to_the_trainer()
    if "numpy.random" in sys.modules:  # (a fork, from the starter or start_method="fork",
        sys.modules["numpy.random"].seed()  # shares its global state with its siblings)
    try:  # Python's reseeds itself, PyTorch's not (torchvision's transforms would repeat)
        if hasattr(sys.modules.get("torch"), "seed"):
            sys.modules["torch"].seed()
    except Exception:  # noqa: BLE001 - (a watch warns of their draws still)
        pass
    conn = Connection(fd)
    try:
        serve(conn)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        pass  # the main process is gone or closed the pipe: nothing left to do
    finally:
        relay_worker.stop_sending()
        conn.close()
