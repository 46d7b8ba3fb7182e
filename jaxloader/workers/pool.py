"""The worker pool: hands steps to workers, takes batches back in step order.

::

    batches(start, stop)                          workers 0..N-1
      submit a task: steps s, s+N, ..  ──Task(id, s, N, slots)──> make each into its slot
      reorder buffer {step: slot} <──Done(id, made, timings)────┘  (messages: protocol)
      yield ring.hand_out(slot) in step order     (zero-copy NumPy views)
      gauges: each worker's stage timings (base/timings), the hand-over's
      block in poll(all worker pipes)              (a dead worker's pipe reports EOF at once)

``N`` is the workers in use (``roster.py``; ``resize`` changes it between two blocks of tasks, a
batch being the same whichever worker makes it). Step ``s`` is made by worker ``s % N``: the
samplers' memos, kept by class of step, are computed once, and a stream's reader for the step lives
there (but for blocks new workers take alone: ``Roster.takers``). A task is several of a worker's
steps (up to half a second of them), so that a small batch costs its share of a task's two
messages; tasks go out a block at a time, one a worker, as many ahead as ``tasks.py`` says. A new
``batches()`` run makes the old run's tasks stale (``StatusBoard.begin_run``): their workers skip
the steps not yet made, the rest are dropped, and their slots come back, so a restore waits for one
step at most; an older run another thread still drives ends at its next turn (``in_process.Runs``).
Broken is a state: once a worker raises or dies, the pool raises a ``WorkerError`` naming the
worker, its pid, what it was doing (a dead one's last report first: why it ended) and the remedy
(``failures.py``), and so does every later call. A late batch is said (``stalls.py``).

One driver at a time: the pipes, the task table and the ring are not thread-safe, and a run
may be driven by the device-prefetch thread while ``close()`` comes from the main thread. A run
holds ``_driver`` (re-entrant) while it executes, never while suspended at a ``yield``, in
``with`` blocks (no gap for a Ctrl-C between taking and owning it). ``close()`` takes it; if a
run still holds it after ``_DRIVER_WAIT_S`` (a worker busy with a slow record), it kills the
workers: the run's ``poll()`` sees their pipes close, and the run breaks and closes the pool.
"""

from __future__ import annotations

import os
import sys
import threading
from time import perf_counter
from typing import Any, Callable, Generator, NoReturn

from jaxloader.base.errors import WorkerError, again, kept
from jaxloader.base.interrupts import run_all
from jaxloader.base.timings import SAMPLE, Gauges, weight
from jaxloader.engines.in_process import Maker, Runs
from jaxloader.workers import failures, protocol, relay, stalls
from jaxloader.workers.endings import at_end, forget_all, stop_all
from jaxloader.workers.process import WorkerProcess, worker_environment
from jaxloader.workers.protocol import Done, Failed, Grow, Init, Said, Slot, Task
from jaxloader.workers.ring import SlotRing
from jaxloader.workers.tasks import MAX_TASK_STEPS, Failure, InFlight, task_shape, timed_steps
from jaxloader.workers.roster import Roster
from jaxloader.workers.source_copies import Copies
from jaxloader.runtime.shm import Segment, destroy_all
from jaxloader.workers.status import StatusBoard

_DEATH_REAP_TIMEOUT_S = 2.0  # a worker whose pipe closed is exiting; its exit code comes soon
_DRIVER_WAIT_S = 0.1  # close() lets a run in another thread reach a yield, else kills workers

class WorkerPool:
    """Makes batches in ``num_workers`` processes (see the module docstring).

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> from jaxloader.batching.batch_maker import BatchMaker
        >>> from jaxloader.order.sampling import Sampler
        >>> pool = WorkerPool(BatchMaker(jl.ArraySource({"y": np.arange(9) * 10}), Sampler(
        ...     9, 3, shuffle=False, seed=0, last_batch="drop")), num_workers=2)
        >>> [b["y"].tolist() for b in pool.batches(1, 3)]  # steps 1 and 2, one from each worker
        [[30, 40, 50], [60, 70, 80]]
        >>> pool.close()
    """

    def __init__(self, maker: Maker, num_workers: int, *, prefetch: int = 2,
                 start_method: str = "exec", worker_init_fn: Callable[[int], object] | None = None,
                 stall_warning_s: float | None = None, timeout_s: float | None = None,
                 max_workers: int | None = None, label: str = "jaxloader",
                 pinner: Any = None) -> None:
        self._maker, self._owner = maker, os.getpid()  # (a fork shares pipes, not workers)
        self._raised = lambda worker, pid, failed: failures.raised(  # (its step named
            worker, pid, failed, lambda step: maker.location(step, False), maker=maker)  # unread)
        self._stall, self._pinner = stalls.StallWatch(stall_warning_s, timeout_s, label), pinner
        self._prefetch, self._timed = prefetch, MAX_TASK_STEPS  # (steps a task: tasks.py)
        self._start_method, self._initial = start_method, num_workers
        self._capacity = max(num_workers, max_workers or 0)  # workers it may grow to
        self._shared: list[Segment] = []  # source arrays shared with the workers, and
        self.copies = Copies(maker)  # their samples, looked at as each run begins and a peek
        self._broken: WorkerError | None = None
        self._closing = [False]  # close() began: a worker gone was killed by it, not dead
        self._mixed_up, self.restarts = False, 0  # a message an interrupt cut: restart them
        self._shared_finalizer = at_end(self, destroy_all, self._shared)
        self._driver = threading.RLock()  # held by a run while it executes (module docstring)
        self._runs = Runs()  # the newest made is the live run (module docstring)
        self._heard = relay.Heard()  # the workers' records and warnings, said here
        self._board = StatusBoard(self._capacity)  # what each worker does (status.py)
        self._board_finalizer = at_end(self, self._board.destroy)  # (at once: a Ctrl-C in
        self.gauges = Gauges(num_workers)  # between lost its memory files and pipes)
        self._environment = worker_environment(os.environ)  # (in the loader's thread: Roster)
        try:  # (a start refused or failed, too: its memory files and workers go with it)
            self._start()
            self._blob = failures.pickled(maker, worker_init_fn, self._shared.append,
                                          self.copies.note)
        except BaseException:  # (a Ctrl-C too: a notebook keeps the frames, and the pool)
            self.close() if hasattr(self, "_finalizer") else self._destroy_shared()
            raise
        self._send_payload()

    def _start(self) -> None:
        """Starts the interpreters (their imports overlap with what follows), a fresh ring."""
        self._ring = SlotRing(self._pinner)  # (pinner: ring.py's, batches placed on a GPU)
        self._shapes: dict[tuple[int, bool], tuple[int, int, int]] = {}  # _task_shape's
        old = getattr(self, "roster", None)  # (a restart: as many workers, as many in use)
        self._workers: list[WorkerProcess] = []  # the pool's before any starts (Roster)
        self._finalizer = at_end(self, stop_all, self._workers, self._ring)
        self.roster = Roster(self._initial if old is None else max(old.target, len(old.workers)),
                              capacity=self._capacity, start_method=self._start_method,
                              gauges=self.gauges, active=None if old is None else old.target,
                              workers=self._workers, environment=self._environment)
        self._tasks: dict[int, InFlight] = {}
        self._next_task, self._run, self._waiting = 0, 0, False  # (in poll(): no mess to cut)

    def _send_payload(self, first: int = 0) -> None:
        if self._closing[0]:  # (close() in a handler as workers started: this run ends)
            raise failures.closed()
        for i in range(first, len(self._workers)):
            self._send(i, Init(sys.path, i, self.roster.active, self._maker.seed, self._blob,
                               self._board.names(i), sys.argv, relay.settings(), self._capacity))

    @property
    def active(self) -> int:  # workers in use now
        return self.roster.active

    def round_steps(self, streaming: bool) -> int:
        """Steps of one task for each worker in use: batches come back this many at a time."""
        return self.roster.active * self._task_shape(streaming)[0]

    @property
    def prefetch(self) -> int:
        """Tasks in flight a worker (``tasks.py``); set it to change it from the next task."""
        return self._prefetch

    @prefetch.setter
    def prefetch(self, value: int) -> None:
        self._prefetch, self._shapes = value, {}

    def slot_room(self) -> tuple[int, int]:  # bytes: a worker's slots ahead, the ring's now
        steps, ahead, _ = self._task_shape(False)
        return ahead * steps * self._ring.slot_size, self._ring.held_bytes

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self._workers]

    @property
    def segment_count(self) -> int:
        """Shared-memory segments this pool owns now (ring slots + shared source arrays)."""
        return self._ring.segment_count + len(self._shared)

    def batches(self, start: int, stop: int | None, resets: list | None = None,
                reports: dict | None = None) -> Generator[Any, None, None]:
        """Batches of steps ``start, start+1, ...`` (to ``stop``, or endless), in order. A
        stream's run passes ``resets`` (each worker's reader state to continue from): step ``s``
        is then made by worker ``s % num_workers``, its reader state after it in ``reports``."""
        self.copies.check()
        return self._batches(self._runs.made(), start, stop, resets, reports)

    def _batches(self, issued: int, start: int, stop: int | None, resets: list | None,
                 reports: dict | None) -> Generator[Any, None, None]:
        with self._driver:  # never held across a yield (``jaxloader.base.interrupts``, 3)
            if os.getpid() != self._owner:  # (before anything the owner's workers would see)
                raise failures.forked(self._owner)
            if self._broken is not None:
                raise again(self._broken)
            if self._runs.stale(issued):  # (a newer run made: this one ends; in_process.Runs)
                return
            if self._mixed_up:
                self._restart()
            if resets is not None and self.roster.target != self.roster.active:
                self._mixed_up = True  # (a Ctrl-C as workers start or take their payload)
                self.roster.apply(self._send_payload, start)  # (a stream: a run, one count)
                self._shapes, self._mixed_up = {}, False
            self._run = run = self._run + 1
            self._board.begin_run(run)  # (the runs before: their workers skip what is left)
            self._stall.begin(None)
        ready: dict[int, tuple] = {}
        next_submit = next_yield = start
        streaming = resets is not None
        try:
            while stop is None or next_yield < stop:
                with self._driver:
                    if os.getpid() != self._owner:  # (one syscall a batch)
                        raise failures.forked(self._owner)
                    if self._closing[0]:  # (close() held the driver while this run waited)
                        raise again(self._broken) if self._broken else failures.closed()
                    if self._runs.stale(issued):
                        return
                    self._board.awaited = next_yield  # (a worker dead while idle: named by it)
                    while stop is None or next_submit < stop:
                        steps, ahead, room = self._task_shape(streaming)
                        if next_submit - next_yield >= room:
                            break
                        roster = self.roster
                        # (a task done, unread, is in flight: read first, lest its worker wait)
                        if not (who := roster.takers(ahead, not streaming)) and not (
                                self._receive(run, ready, block=False)
                                and (who := roster.takers(ahead, not streaming))):
                            break
                        if roster.target != roster.active and not streaming:
                            roster.apply(self._send_payload, next_submit)
                            self._shapes = {}
                            continue
                        steps = 1 if next_submit == start else steps  # (its first batch soon)
                        next_submit = self._submit_block(next_submit, stop, steps, run, resets, who)
                    if next_yield not in ready:
                        self._receive(run, ready, awaited=next_yield)
                        continue
                    # (segment, layout, objects, report), or a Failure or a Timed; handed in a
                    # list popped at the yield (a local would keep the slot lent till resumed)
                    made = ready.pop(next_yield)
                    if type(made) is tuple:
                        handed = [self._ring.hand_out(*made[:3])]
                    else:
                        if type(made) is Failure:  # raised in order, at its turn
                            self._break(*made)
                        began = perf_counter()  # (one a timed receipt: base/timings)
                        handed = [self._ring.hand_out(*made[:3])]
                        self.gauges.handed_out(perf_counter() - began, len(ready))
                    if reports is not None:
                        reports[next_yield] = made[3]
                    next_yield += 1
                yield handed.pop()
        except BaseException as e:
            # a message may be cut (base.interrupts, 2): unless in poll(), next run restarts them
            if not (self._waiting or isinstance(e, (GeneratorExit, WorkerError))):
                self._mixed_up = True
            raise
        finally:
            with self._driver:  # (a death between runs names no step of this one)
                self._waiting, self._board.awaited = False, None
                for made in ready.values():
                    if type(made) is not Failure:
                        self._ring.give_back(made[0])

    def _task_shape(self, streaming: bool) -> tuple[int, int, int]:
        """``tasks.task_shape`` for the slot size now, kept (asked every batch handed out)."""
        key = (self._ring.slot_size, streaming)
        if (shape := self._shapes.get(key)) is None:
            shape = self._shapes[key] = task_shape(*key, self._prefetch, self.roster.active,
                                                   self._timed, self._ring.budget)
        return shape

    def _submit_block(self, start: int, stop: int | None, steps: int, run: int,
                      resets: list | None, who: list[int]) -> int:
        """Tasks for ``[start, end)``, ``steps`` a worker, ``who[i]``'s ``= i mod N``: ``end``."""
        n = len(who)
        end = start + n * steps if stop is None else min(start + n * steps, stop)
        for first in range(start, min(start + n, end)):
            worker = who[first % n]
            reset = None
            if resets is not None and resets[worker] is not None:
                reset, resets[worker] = resets[worker], None
            self._submit(worker, first, len(range(first, end, n)), n, run, reset)
        return end

    def _submit(self, w: int, first: int, count: int, stride: int, run: int, reset: Any) -> None:
        segments = [self._ring.take(w) for _ in range(count)]
        task_id, self._next_task = self._next_task, self._next_task + 1
        self._tasks[task_id] = InFlight(w, first, stride, run, segments)
        self.roster.in_flight[w] += 1
        self._send(w, Task(task_id, first, stride, tuple((s.name, s.size) for s in segments),
                           reset, self.gauges.trace, run))

    def _send(self, worker: int, message: Any) -> None:
        try:
            protocol.send(self._workers[worker].conn, message)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            self._worker_died(worker)

    def _receive(self, run: int, ready: dict, block: bool = True,
                 awaited: int | None = None) -> bool:
        """Whether a report was read: waits for one (``block``, the consumer awaiting step
        ``awaited``; else what has come), files its result or raises its failure."""
        roster = self.roster
        self._waiting = True  # (readable, or hung up (EOF) or failed: all reported)
        events = self._wait(awaited) if block else roster.poller.poll(0)
        self._waiting = False
        if not events:  # (a block waits for one)
            return False
        gauges = self.gauges  # the reads timed by base/timings' rule (weight, asked inline)
        received = gauges.receipts = gauges.receipts + 1
        began = perf_counter() if received <= SAMPLE or not received & (SAMPLE - 1) else 0.0
        for fd, _ in events:
            worker = roster.by_fd[fd]
            if worker < 0:  # a worker's end (its pidfd): what it sent before is read first
                if roster.ended(~worker):
                    self._worker_died(~worker)
                continue
            try:
                message = protocol.receive(self._workers[worker].conn)
            except (EOFError, ConnectionResetError, OSError):
                self._worker_died(worker)
            if type(message) is Done:
                if message.timings is not None and message.timings[-1] >= gauges.reset_at:
                    gauges.makers[worker].absorb(message.timings[:-1])  # (work since)
                    if (timed := timed_steps(message.timings)) != self._timed:
                        self._timed, self._shapes = timed, {}  # (tasks of its time)
                task = self._tasks[message.task_id]
                segments, layouts = task.segments, roster.layouts
                for nth, layout, objects, report in message.made:
                    if layout is not None and type(layout) is not str:  # (str: SKIPPED, stale)
                        layouts[worker] = layout
                    segment, segments[nth] = segments[nth], None
                    if task.run == run:  # a plain tuple: built once a batch
                        ready[task.first + nth * task.stride] = (
                            segment, layouts[worker], objects, report)
                    else:
                        self._ring.give_back(segment)
                if segments.count(None) == len(segments):  # every step back: the task is done
                    del self._tasks[message.task_id]
                    roster.in_flight[worker] -= 1
            elif type(message) is Grow:
                segments = self._tasks[message.task_id].segments
                segment = segments[message.nth] = self._ring.grow(segments[message.nth], message.nbytes)
                self._send(worker, Slot(message.task_id, message.nth, segment.name,
                                        segment.size))
            elif type(message) is Said:  # (what its code logged and warned: before its Done)
                self._heard.replay(message, worker)
            elif type(message) is Failed:
                failure = Failure(*self._raised(worker, self._workers[worker].pid, message))
                failed_task = self._tasks.pop(message.task_id, None)
                if failed_task is None:  # the worker failed to start: nothing else can run
                    self._break(*failure)
                self.roster.in_flight[worker] -= 1
                for segment in failed_task.segments:  # the failed step's, and those after it
                    if segment is not None:
                        self._ring.give_back(segment)
                if failed_task.run == run:
                    ready[message.step] = failure
        if began:
            gauges.received(weight(received), perf_counter() - began, ready)
        return True

    def _wait(self, awaited: int | None) -> list:
        """``poll()`` until a worker reports; a long wait for step ``awaited`` said (``stalls``)."""
        on = (self._run, self._tasks.values(), self._board)  # (the run's tasks, as they are)
        events, error = self._stall.wait(self.roster.poller.poll, awaited, lambda step: (
            stalls.stall_report(step, *on, self.pids, self._maker.location, self.active)),
            lambda step: stalls.holder_progress(step, *on),
            lambda step: stalls.behind(step, *on, self._maker.location))
        if error is not None:
            self._break(error, None)
        return events

    def _worker_died(self, worker: int) -> NoReturn:
        if self._closing[0]:  # (killed by close() from another thread, or at exit)
            raise failures.closed()
        w = self._workers[worker]
        if (failed := self._heard.last_words(w.conn, worker)) is not None:  # why it ended
            self._break(*self._raised(worker, w.pid, failed))
        self._break(failures.died(worker, w.pid, w.exitcode(timeout=_DEATH_REAP_TIMEOUT_S),
                                  self._board, self._maker.location, w.starter_ended()), None)

    def _break(self, error: WorkerError, cause: BaseException | None) -> NoReturn:
        error.__cause__ = cause
        self._broken = kept(error)
        self.close()
        raise error

    def _restart(self) -> None:
        """New workers and ring after an interrupted run (its batches out stay readable)."""
        self._stop_workers()
        self._board.restarted()  # (before the new workers can write their rows)
        self._start()
        self._send_payload()
        self._mixed_up, self.restarts = False, self.restarts + 1

    def close(self) -> None:
        """Stops the workers (signal, drain, join, kill), unlinks every segment; idempotent,
        from any thread (module docstring). A Ctrl-C in it is raised after its later steps."""
        if os.getpid() != self._owner:  # (a forked child's: its copies of the pipes alone)
            return forget_all(self._workers)
        self._closing[0] = True
        if not self._driver.acquire(timeout=_DRIVER_WAIT_S):
            for worker in self._workers:  # the run in the other thread sees them go, and stops
                worker.kill()
        else:
            self._driver.release()
        with self._driver:
            run_all([self._stop_workers, self._destroy_shared])

    # Called, not through their finalizers (which run once: cut short by a Ctrl-C, never to
    # end), so that they run in full again next call; finalizers are for a pool only collected.
    def _stop_workers(self) -> None:
        self._heard.all_last_words(self._workers)  # (records a thread logged after the last)
        stop_all(self._workers, self._ring)
        self._finalizer.detach()

    def _destroy_shared(self) -> None:
        destroy_all(self._shared)
        self._shared_finalizer.detach()
        self._board_finalizer()
