"""The worker pool: hands steps to workers, takes batches back in step order.

::

    batches(start, stop)                          workers 0..N-1
      submit a task: steps s, s+N, ..  ──Task(id, s, N, slots)──> make each into its slot
      reorder buffer {step: slot} <──Done(id, made)─────────────┘  (messages: protocol)
      yield ring.hand_out(slot) in step order     (zero-copy NumPy views)
      block in poll(all worker pipes)              (a dead worker's pipe reports EOF at once)

Step ``s`` is made by worker ``s % N``: the samplers' memos, kept by class of step, are computed
once, and a stream's reader for the step lives there. A task is up to ``_MAX_TASK_STEPS`` of a
worker's steps, as many as fit in ``_TASK_BYTES`` (one step while the batch size is not known,
and for streams): a small batch then costs its share of the two messages and wakeups a task
takes, not two of its own (measured in docs/benchmarks.md). Tasks go out a block at a time, one
a worker, when every worker has fewer than ``T`` in flight and the block stays within ``N * T``
tasks' steps of the consumer: ``T`` is ``prefetch``, or for small batches as many tasks as hold
``prefetch`` MiB, up to 64 steps a worker and 256 in all (``_tasks_ahead``). A slot goes back
to the worker that wrote it (``SlotRing.take(worker)``), which keeps its mapping. Which worker
makes a step does not matter to the batch (a pure function of its step). A new ``batches()``
run makes the old run's tasks stale: their results are dropped and their slots reused, so a
restore never waits for them.

Broken is a state: once a worker raises or dies, the pool raises a ``WorkerError`` naming the
worker, its pid, the exit code or exception, the step and record positions (a worker writes
the step it starts into its status row first: ``status.py``), with the worker's traceback, and
every later call raises that same error.

A late batch is said, not waited for in silence: once the consumer has waited
``stall_warning_s`` for a step, the pool logs (``logging.getLogger("jaxloader")``) which worker
holds which step, for how long, its process state and its Python stack, and again every
``stall_warning_s``; past ``timeout_s`` it raises ``StallError`` saying the same.

One driver at a time: the pipes, the task table and the ring are not thread-safe, and a run may
be driven by the device-prefetch thread while ``close()`` comes from the main thread. A run holds
``_driver`` (a re-entrant lock) while it executes, never while suspended at a ``yield``; it takes
it in ``with`` blocks, which leave no gap for a Ctrl-C between taking and owning it. ``close()``
takes it; if a run still holds it after ``_DRIVER_WAIT_S`` (a worker busy with a slow record), it
kills the workers, which only sends signals: the run's ``poll()`` then sees their pipes close,
the run breaks and closes the pool itself, in its own thread, and ``close()`` gets the lock.
"""

from __future__ import annotations

import functools
import logging
import pickle
import select
import sys
import threading
import time
import weakref
from typing import Any, Callable, Generator, NamedTuple, NoReturn

from jaxloader.errors import SharedMemoryError, StallError, WorkerError
from jaxloader.interrupts import run_all
from jaxloader.pipeline import BatchMaker
from jaxloader.workers import payload, protocol
from jaxloader.workers.process import STOP_GRACE_S, WorkerProcess
from jaxloader.workers.protocol import Done, Failed, Grow, Init, Slot, Task
from jaxloader.workers.ring import SlotRing
from jaxloader.workers.shm import Segment
from jaxloader.workers.status import StatusBoard

_LOG = logging.getLogger("jaxloader")

_DEATH_REAP_TIMEOUT_S = 2.0  # a worker whose pipe closed is exiting; its exit code comes soon
# close() first lets a run in another thread reach its next yield; one that does not (waiting on
# a worker busy in a transform) sees the workers killed instead, so close() stays well under 1 s
_DRIVER_WAIT_S = 0.1
# A task makes as many steps as fit in this many bytes of slots, up to _MAX_TASK_STEPS: batches
# of 22 KB (256 rows of Parquet) take 16 a task, batches of 1 MiB or more one. Slots in flight:
# N * prefetch * steps a task, so at most ~prefetch MiB a worker for small batches. 16, not 8:
# ~10% more rows/s with 2 workers, from Parquet read locally and from memory; 32 read
# Parquet slower again (more rows a task than the caches hold; docs/benchmarks.md).
_TASK_BYTES = 1 << 20
_MAX_TASK_STEPS = 16
# Tasks in flight a worker: ``prefetch``, or for small batches as many as hold ``prefetch`` MiB
# of them, up to this many steps: a source that stalls now and then (a Parquet worker decoding
# the row groups of a new window, ~30 ms) leaves the consumer batches made ahead to take, and
# the workers room to run ahead after. Measured (Parquet read locally, 2 workers, 22 KB
# batches): 4 tasks of 16 in flight a worker, not 2, left a core idle 11% of the time, not 21%,
# and read ~6% more rows a second; 6 tasks no more (docs/benchmarks.md). With the margin of the
# block being submitted, a worker writes ~80 slots: under the mappings it keeps (worker.py).
_MAX_AHEAD_STEPS = 64
# and at most this many steps for all the workers together: each slot holds a descriptor in the
# main process (many systems allow 1,024), so 8 workers or more keep ``prefetch`` tasks, as before
_MAX_AHEAD_SLOTS = 256


class _Task(NamedTuple):
    """A task in flight: which worker makes which steps, for which run, into which slots."""

    worker: int
    first: int  # its steps: first + nth * stride
    stride: int
    run: int
    segments: list  # each step's slot, in order; None once its batch is back


class _Failure(NamedTuple):
    """A step that failed in its worker: raised at its turn, after the batches before it."""

    error: WorkerError
    cause: BaseException | None


class WorkerPool:
    """Makes batches in ``num_workers`` processes (see the module docstring).

    Example:
        >>> import numpy as np
        >>> from jaxloader.sampling import Sampler
        >>> from jaxloader.sources import ArraySource
        >>> maker = BatchMaker(ArraySource({"x": np.arange(6)}),
        ...                    Sampler(6, 2, shuffle=False, seed=0, last_batch="drop"))
        >>> pool = WorkerPool(maker, num_workers=2)
        >>> [b["x"].tolist() for b in pool.batches(0, 3)]
        [[0, 1], [2, 3], [4, 5]]
        >>> pool.close()
    """

    def __init__(
        self,
        maker: BatchMaker,
        num_workers: int,
        *,
        prefetch: int = 2,
        start_method: str = "exec",
        worker_init_fn: Callable[[int], None] | None = None,
        stall_warning_s: float | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self._maker = maker
        self._stall_warning_s, self._timeout_s = stall_warning_s, timeout_s
        self._awaited: tuple[int, float, int] | None = None  # (step, since, warnings given)
        self._prefetch = prefetch
        self._start_method = start_method
        self._num_workers = num_workers
        self._shared: list[Segment] = []  # source arrays shared with the workers
        self._broken: WorkerError | None = None
        self._mixed_up = False  # an interrupt may have cut a message: restart the workers
        self.restarts = 0  # times the workers were replaced after such an interrupt
        self._shared_finalizer = weakref.finalize(self, _destroy_all, self._shared)
        self._driver = threading.RLock()  # held by a run while it executes (module docstring)
        self._board = StatusBoard(num_workers)  # what each worker is doing (status.py)
        self._board_finalizer = weakref.finalize(self, self._board.destroy)
        self._start()
        try:
            self._blob = payload.dumps((maker, worker_init_fn), self._shared.append)
        except SharedMemoryError:
            self.close()
            raise  # picklable, but no memory to share it in: the error says so
        except Exception as e:
            self.close()
            raise _unpicklable(e, maker, worker_init_fn) from e
        self._send_payload()

    def _start(self) -> None:
        """Starts the interpreters (their imports overlap with what follows) and a
        fresh ring; the bookkeeping of tasks starts empty."""
        self._ring = SlotRing()
        self._shapes: dict[tuple[int, bool], tuple[int, int]] = {}  # _task_shape's
        self._workers: list[WorkerProcess] = []
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self._ring)
        for _ in range(self._num_workers):
            self._workers.append(WorkerProcess(self._start_method))
        # One poller for the pool's life: blocking in poll() costs a syscall, where
        # multiprocessing.connection.wait builds and fills a new selector every call.
        self._poller = select.poll()
        self._by_fd: dict[int, int] = {}
        for i, w in enumerate(self._workers):
            self._by_fd[w.conn.fileno()] = i
            self._poller.register(w.conn.fileno(), select.POLLIN)
        self._tasks: dict[int, _Task] = {}
        self._in_flight = [0] * self._num_workers
        self._layouts: list[Any] = [None] * self._num_workers
        self._next_task = 0
        self._run = 0
        self._waiting = False  # True only inside poll(): an interrupt there leaves no mess

    def _send_payload(self) -> None:
        for i, worker in enumerate(self._workers):
            protocol.send(worker.conn, Init(sys.path, i, self._num_workers, self._maker.seed,
                                            self._blob, self._board.names(i)))

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self._workers]

    @property
    def segment_count(self) -> int:
        """Shared-memory segments this pool owns now (ring slots + shared source arrays)."""
        return self._ring.segment_count + len(self._shared)

    def batches(self, start: int, stop: int | None, resets: list | None = None,
                reports: dict | None = None) -> Generator[Any, None, None]:
        """Batches of steps ``start, start+1, ...`` (to ``stop``, or endless), in order.

        A stream's run passes ``resets`` (each worker's reader state to continue from): step
        ``s`` is then made by worker ``s % num_workers``, and the reader state after each
        batch handed out is put in ``reports[step]``."""
        with self._driver:  # never held across a yield (``jaxloader.interrupts``, 3)
            self._raise_if_broken()
            if self._mixed_up:
                self._restart()
            self._run += 1
            run = self._run
            self._awaited = None
        ready: dict[int, tuple] = {}
        next_submit = next_yield = start
        streaming = resets is not None
        try:
            while stop is None or next_yield < stop:
                with self._driver:
                    while stop is None or next_submit < stop:
                        steps, tasks = self._task_shape(streaming)
                        if next_submit - next_yield >= len(self._workers) * tasks * steps:
                            break
                        # A task done but not yet read (the consumer was busy with batches
                        # ready before it) still counts as in flight: read what has come
                        # before deciding, or its worker waits for work it could be doing
                        if max(self._in_flight) >= tasks and not (
                                self._receive(run, ready, block=False)
                                and max(self._in_flight) < tasks):
                            break
                        next_submit = self._submit_block(next_submit, stop, steps, run, resets)
                    if next_yield not in ready:
                        self._receive(run, ready, awaited=next_yield)
                        continue
                    made = ready.pop(next_yield)  # (segment, layout, objects, report) or a
                    if type(made) is _Failure:  # _Failure: raised in order, at its turn
                        self._break(*made)
                    if reports is not None:
                        reports[next_yield] = made[3]
                    next_yield += 1
                    # Made under the lock, held by nothing here while suspended at the yield
                    # (a local would keep the slot lent until the next resume).
                    handed = [self._ring.hand_out(*made[:3])]
                yield handed.pop()
        except BaseException as e:
            # A message may have been cut (``jaxloader.interrupts``, 2): unless blocked in
            # poll(), the next run restarts the workers.
            if not (self._waiting or isinstance(e, (GeneratorExit, WorkerError))):
                self._mixed_up = True
            raise
        finally:
            with self._driver:
                self._waiting = False
                for made in ready.values():
                    if type(made) is not _Failure:
                        self._ring.give_back(made[0])

    def _task_shape(self, streaming: bool) -> tuple[int, int]:
        """``(steps a task, tasks ahead a worker)`` for the ring's slot size now; computed
        again only when that size changes (it is asked for every batch handed out)."""
        key = (self._ring.slot_size, streaming)
        shape = self._shapes.get(key)
        if shape is None:
            steps = self._steps_per_task(streaming)
            shape = self._shapes[key] = (steps, self._tasks_ahead(steps))
        return shape

    def _steps_per_task(self, streaming: bool) -> int:
        """Steps a task (module docstring): one a task for streams and until a batch's size
        is known."""
        size = self._ring.slot_size
        if streaming or not size:
            return 1
        return max(1, min(_MAX_TASK_STEPS, _TASK_BYTES // size))

    def _tasks_ahead(self, steps: int) -> int:
        """Tasks of ``steps`` steps in flight a worker: ``prefetch``, more for small batches
        (``_MAX_AHEAD_STEPS``, ``_MAX_AHEAD_SLOTS``). Tasks of one step (batches of 1 MiB or
        more, and streams, whose readers need no more ahead) keep ``prefetch``."""
        size = self._ring.slot_size
        if not size or steps == 1:
            return self._prefetch
        held = self._prefetch * _TASK_BYTES // (steps * size)
        room = min(_MAX_AHEAD_STEPS, _MAX_AHEAD_SLOTS // len(self._workers)) // steps
        return max(self._prefetch, min(held, room))

    def _submit_block(self, start: int, stop: int | None, steps: int, run: int,
                      resets: list | None) -> int:
        """Tasks for steps ``[start, end)``, ``steps`` a worker, each worker ``w`` those
        ``= w mod N``; returns ``end``."""
        workers = len(self._workers)
        end = start + workers * steps if stop is None else min(start + workers * steps, stop)
        for first in range(start, min(start + workers, end)):
            worker = first % workers
            reset = None
            if resets is not None and resets[worker] is not None:
                reset, resets[worker] = resets[worker], None
            self._submit(worker, first, len(range(first, end, workers)), run, reset)
        return end

    def _submit(self, worker: int, first: int, count: int, run: int, reset: Any) -> None:
        segments = [self._ring.take(worker) for _ in range(count)]
        task_id = self._next_task
        self._next_task += 1
        self._tasks[task_id] = _Task(worker, first, len(self._workers), run, segments)
        self._in_flight[worker] += 1
        self._send(worker, Task(task_id, first, len(self._workers),
                                tuple((s.name, s.size) for s in segments), reset))

    def _send(self, worker: int, message: Any) -> None:
        try:
            protocol.send(self._workers[worker].conn, message)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            self._worker_died(worker)

    def _receive(self, run: int, ready: dict, block: bool = True,
                 awaited: int | None = None) -> bool:
        """Blocks until some worker reports (with ``block``, while the consumer awaits step
        ``awaited``; else reads only what has come); files its result or raises its failure.
        Whether a report was read."""
        self._waiting = True
        # readable, or hung up (EOF) or failed: all reported
        events = self._wait(awaited) if block else self._poller.poll(0)
        self._waiting = False
        for fd, _ in events:
            worker = self._by_fd[fd]
            try:
                message = protocol.receive(self._workers[worker].conn)
            except (EOFError, ConnectionResetError, OSError):
                self._worker_died(worker)
            if type(message) is Done:
                task = self._tasks[message.task_id]
                segments = task.segments
                for nth, layout, objects, report in message.made:
                    if layout is not None:
                        self._layouts[worker] = layout
                    segment, segments[nth] = segments[nth], None
                    if task.run == run:  # a plain tuple: built once a batch
                        ready[task.first + nth * task.stride] = (
                            segment, self._layouts[worker], objects, report)
                    else:
                        self._ring.give_back(segment)
                if segments.count(None) == len(segments):  # every step back: the task is done
                    del self._tasks[message.task_id]
                    self._in_flight[worker] -= 1
            elif type(message) is Grow:
                segments = self._tasks[message.task_id].segments
                segment = self._ring.grow(segments[message.nth], message.nbytes)
                segments[message.nth] = segment
                self._send(worker, Slot(message.task_id, message.nth, segment.name,
                                        segment.size))
            elif type(message) is Failed:
                failure = self._worker_failed(worker, message)
                failed_task = self._tasks.pop(message.task_id, None)
                if failed_task is None:  # the worker failed to start: nothing else can run
                    self._break(*failure)
                self._in_flight[worker] -= 1
                for segment in failed_task.segments:  # the failed step's, and those after it
                    if segment is not None:
                        self._ring.give_back(segment)
                if failed_task.run == run:
                    ready[message.step] = failure
        return bool(events)

    def _wait(self, awaited: int | None) -> list:
        """``poll()`` until a worker reports; a wait for step ``awaited`` longer than
        ``stall_warning_s`` is logged (and again every ``stall_warning_s``), one longer than
        ``timeout_s`` raises ``StallError`` (module docstring)."""
        warn_s, timeout_s = self._stall_warning_s, self._timeout_s
        if awaited is None or (warn_s is None and timeout_s is None):
            return self._poller.poll()
        if self._awaited is None or self._awaited[0] != awaited:
            self._awaited = (awaited, time.monotonic(), 0)
        while True:
            _, since, warned = self._awaited
            due = [t for t in (None if warn_s is None else warn_s * (warned + 1), timeout_s)
                   if t is not None]
            left = min(due) - (time.monotonic() - since)
            events = self._poller.poll(max(0.0, left) * 1000)  # (overdue: what has come)
            if events:
                return events
            waited = time.monotonic() - since
            if timeout_s is not None and waited >= timeout_s:
                self._break(StallError(
                    f"no batch for {waited:,.1f} s, past timeout_s={timeout_s:g}: "
                    + self._stall_report(awaited) + "\n--- the loader is broken; fix what "
                    "holds the worker, or raise timeout_s, then create a new loader ---"), None)
            if warn_s is not None and waited >= warn_s * (warned + 1):
                _LOG.warning(
                    "jaxloader: no batch for %.1f s: %s\nThe loader keeps waiting (timeout_s= "
                    "makes a wait this long an error; stall_warning_s= sets when this is said)",
                    waited, self._stall_report(awaited))
                # the next a stall_warning_s after this one was made (a report takes time)
                self._awaited = (awaited, since, int((time.monotonic() - since) // warn_s) + 1)

    def _stall_report(self, awaited: int) -> str:
        """What the consumer awaits and what each worker is doing, with their stacks."""
        location = self._maker.location
        workers = len(self._workers)
        task = next((t for t in self._tasks.values() if awaited in range(
            t.first, t.first + t.stride * len(t.segments), t.stride)), None)
        sent = "" if task is None or len(task.segments) == 1 else (
            f" (in its task of steps {task.first}, {task.first + task.stride}, ..., "
            f"{task.first + task.stride * (len(task.segments) - 1)}, reported once all are "
            "made)")
        return "\n".join([f"{location(awaited)} is awaited, from worker {awaited % workers}"
                          f"{sent}. The workers:", *self._board.report(self.pids, location)])

    def _worker_failed(self, worker: int, failed: Failed) -> _Failure:
        """The error to raise, and its cause, for a worker's failure report."""
        w = self._workers[worker]
        where = "while starting (loading the payload or running worker_init_fn)"
        if failed.step is not None:
            where = f"at {self._maker.location(failed.step)}"
        cause = None
        if failed.pickled is not None:
            try:
                cause = pickle.loads(failed.pickled)
            except Exception:  # noqa: BLE001 - the text below still says what happened
                cause = None
        return _Failure(WorkerError(
            f"worker {worker} (pid {w.pid}) raised {where}: {failed.summary}\n"
            f"--- traceback in the worker ---\n{failed.traceback.rstrip()}\n"
            "--- the loader is broken; fix the cause and create a new DataLoader ---"
        ), cause)

    def _worker_died(self, worker: int) -> NoReturn:
        w = self._workers[worker]
        code = w.exitcode(timeout=_DEATH_REAP_TIMEOUT_S)
        step = self._board.making(worker)  # the step it said it started (status.py)
        how = f"exit code {code}" if code is None or code >= 0 else f"killed by signal {-code}"
        if code is not None and code < 0 and -code == 9:
            how += " (SIGKILL: often the out-of-memory killer)"
        doing = f"while making {self._maker.location(step)}" if step is not None else (
            "while starting" if self._board.starting(worker) else "while idle")
        self._break(WorkerError(
            f"worker {worker} (pid {w.pid}) died {doing}: {how}; the loader is broken; check "
            "memory use and native code in transforms, then create a new DataLoader"
        ), None)

    def _break(self, error: WorkerError, cause: BaseException | None) -> NoReturn:
        error.__cause__ = cause
        self._broken = error
        self.close()
        raise error

    def _restart(self) -> None:
        """New workers and ring after an interrupted run (the batches it handed out stay
        readable); the shared source arrays and the payload are reused. Interrupted itself, it
        runs again next time."""
        self._stop_workers()
        self._board.restarted()  # (before the new workers can write their rows)
        self._start()
        self._send_payload()
        self._mixed_up = False
        self.restarts += 1

    def _raise_if_broken(self) -> None:
        if self._broken is not None:
            raise self._broken

    def close(self) -> None:
        """Stops the workers (signal, drain, join, kill) and unlinks every segment. Idempotent;
        an interrupt (Ctrl-C) during it does not stop the later steps, it is raised after them.
        Safe from any thread while another drives a run (see the module docstring)."""
        if not self._driver.acquire(timeout=_DRIVER_WAIT_S):
            for worker in self._workers:  # the run in the other thread sees them go, and stops
                worker.kill()
        else:
            self._driver.release()
        with self._driver:
            run_all([self._stop_workers, self._destroy_shared])

    # Called, not through their finalizers: a finalizer runs once, so one cut short by a Ctrl-C
    # (at its start, say) would never finish; these run in full again on the next call (each
    # step is idempotent), and the finalizers stay for a pool that is only collected.
    def _stop_workers(self) -> None:
        _shutdown(self._workers, self._ring)
        self._finalizer.detach()

    def _destroy_shared(self) -> None:
        _destroy_all(self._shared)
        self._shared_finalizer.detach()
        self._board_finalizer()


def _shutdown(workers: list[WorkerProcess], ring: SlotRing) -> None:
    """Every step runs even if an earlier one is interrupted (``jaxloader.interrupts``, 4).
    The workers wind down together: told at once, given one grace (``STOP_GRACE_S``) between
    them, then those still running are killed."""
    deadline = time.monotonic() + STOP_GRACE_S
    steps: list[Callable[[], Any]] = [w.ask_to_stop for w in workers]
    steps += [functools.partial(w.stop, deadline) for w in workers] + [ring.close]
    run_all(steps)


def _destroy_all(segments: list[Segment]) -> None:
    run_all([s.destroy for s in segments])
    segments.clear()


def _unpicklable(e: Exception, maker: BatchMaker, init_fn: Any) -> WorkerError:
    suspects = [("source", maker.source), ("worker_init_fn", init_fn)]
    suspects += [(f"transforms {t!r}", t) for t in maker.record_transforms + maker.batch_transforms]
    for name, obj in suspects:
        shared: list[Segment] = []
        try:
            payload.dumps(obj, shared.append)
        except Exception as inner:  # noqa: BLE001
            return WorkerError(
                f"cannot send the {name} ({obj!r:.80}) to worker processes: "
                f"{type(inner).__name__}: {inner}; make it picklable by cloudpickle (no open "
                "files, locks or sockets; open them lazily in the worker), or use num_workers=0"
            )
        finally:
            _destroy_all(shared)  # only a probe: nothing will read these
    return WorkerError(f"cannot send the loader to worker processes: {type(e).__name__}: {e}")
