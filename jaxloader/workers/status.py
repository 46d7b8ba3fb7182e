"""What each worker is doing, for the main process to say when a worker dies or a batch is late.

::

    main process  StatusBoard(n): a shared table, a row a worker (state, step, since), and the
                  workers' stack files (``stacks.StackFiles``); their names go to the workers
                  in ``Init``
    worker        WorkerStatus: making(step) before it makes a step (no message, no syscall:
                  three stores into the table), idle() when its task is done; its stacks are
                  taken by a thread of its own (``stacks.WorkerStacks``)
    main process  board.doing(w) ─> "making step 25 (epoch 0, record positions ...) for 312 s"
                  board.report(pids, where) ─> each worker's state, step and stacks
                  board.crash(w) ─> a worker's stacks as a fatal signal ended it

The table is written by the worker before it starts a step, so a worker that dies names the
step it died in, not its task's first; a stall report names what each worker holds and for
how long. ``since`` is ``CLOCK_MONOTONIC`` in nanoseconds, one clock for every process.

Example:
    >>> board = StatusBoard(2)
    >>> mine = WorkerStatus(board.names(1), 1)
    >>> mine.idle(); mine.making(25)
    >>> board.doing(1, lambda step: f"step {step}").startswith("making step 25 for")
    True
    >>> mine.close(); board.destroy()
    True
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import numpy as np

from jaxloader.runtime import shm
from jaxloader.workers.stacks import StackFiles, WorkerStacks

_FIELDS = 3  # a worker's row: state, step, since
# starting: its stack thread not yet started (asked now, it would answer at some later time);
# loading: its stack thread runs, its payload and worker_init_fn are loading
_IDLE, _MAKING, _STARTING, _LOADING = 0, 1, 2, 3


class StatusBoard:
    """The main process's side: the table and the stack files of ``num_workers`` workers."""

    def __init__(self, num_workers: int) -> None:
        self._stacks = StackFiles(num_workers)
        try:
            self._segment = shm.Segment.create((1 + num_workers * _FIELDS) * 8)
        except BaseException:
            self._stacks.destroy()
            raise
        cells = np.frombuffer(self._segment.memory, np.int64)
        self._run = cells[:1]  # the pool's run now: a worker skips the steps of one before
        self._rows = cells[1:1 + num_workers * _FIELDS].reshape(num_workers, _FIELDS)
        self.awaited: int | None = None  # the step the run's consumer awaits (the pool's
        # driver sets it): a worker that dies idle is named with it
        self.restarted()

    def names(self, worker: int) -> tuple[str, int, str, str]:
        """What worker ``worker`` opens: (the table's name, its size, its stack file, its
        request pipe)."""
        return (self._segment.name, self._segment.size, *self._stacks.names(worker))

    def restarted(self) -> None:
        """Every worker is starting (new ones: at first, or after an interrupted run); what
        the workers before wrote is gone (a crash dump is not a new worker's)."""
        self._rows[:, 0] = _STARTING
        self._rows[:, 2] = time.monotonic_ns()
        self._run[0] = 0
        self._stacks.clear()

    def begin_run(self, run: int) -> None:
        """The pool's run is ``run`` from now: the tasks of those before are stale, and their
        workers skip what they have not made of them (``WorkerStatus.stale``)."""
        self._run[0], self.awaited = run, None

    def making(self, worker: int) -> int | None:
        """The step worker ``worker`` is making, or ``None``."""
        state, step, _ = (int(v) for v in self._rows[worker])
        return step if state == _MAKING else None

    def making_since(self, worker: int) -> float | None:
        """When worker ``worker`` began the step it is making (``time.monotonic``), or
        ``None``."""
        state, _, since = (int(v) for v in self._rows[worker])
        return since / 1e9 if state == _MAKING else None

    def starting(self, worker: int) -> bool:
        """Whether worker ``worker`` has not yet loaded its payload."""
        return int(self._rows[worker, 0]) in (_STARTING, _LOADING)

    def doing(self, worker: int, where: Callable[[int], str]) -> str:
        """What worker ``worker`` is doing and for how long, in words (``where(step)`` names a
        step)."""
        state, step, since = (int(v) for v in self._rows[worker])
        held = f"for {(time.monotonic_ns() - since) / 1e9:,.1f} s"
        if state == _MAKING:
            return f"making {where(step)} {held}"
        if state == _STARTING or state == _LOADING:
            return f"starting (loading the payload, running worker_init_fn) {held}"
        return f"idle, waiting for a task {held}"

    def report(self, pids: list[int], where: Callable[[int], str]) -> list[str]:
        """A line a worker (its pid, process state and what it is doing, ``doing``) and its
        stacks, indented: what a stall report says of the workers."""
        lines = []
        for i, (pid, stack) in enumerate(zip(pids, self.stacks(pids))):
            lines.append(f"  worker {i} (pid {pid}, {process_state(pid)}): "
                         f"{self.doing(i, where)}")
            lines.extend("    " + line for line in stack.splitlines())
        return lines

    def stacks(self, pids: list[int]) -> list[str]:
        """Each worker's Python stacks (``StackFiles.take``), asked of those that can answer:
        not stopped, gone, or starting (its stack thread not yet running)."""
        known = os.path.isdir("/proc/self")  # (else no state is known: asked all the same)
        return self._stacks.take([_state(pid) not in ("T", "t", "Z", None if known else "")
                                  and self._rows[worker, 0] != _STARTING
                                  for worker, pid in enumerate(pids)])

    def crash(self, worker: int) -> str | None:
        """Worker ``worker``'s stacks as a fatal signal ended it (``StackFiles.crash``)."""
        return self._stacks.crash(worker)

    def destroy(self) -> bool:
        """Releases the table and the stack files. Idempotent."""
        self._stacks.destroy()
        self._rows = np.zeros((0, _FIELDS), np.int64)  # the views go: the mapping can close
        self._run = np.zeros(1, np.int64)
        return self._segment.destroy()


class WorkerStatus:
    """A worker's side: its row of the table, and its stack thread."""

    def __init__(self, names: tuple[str, int, str, str], worker: int,
                 crash_dumps: bool = False) -> None:
        """``crash_dumps``: a fatal signal writes this process's stacks where
        ``StatusBoard.crash`` reads them (``stacks.WorkerStacks``)."""
        table, size, stacks, asks = names
        self._mapping: Any = shm.attach(table, size)
        cells = memoryview(self._mapping).cast("q")
        self._run = cells[:1]
        self._row = cells[1 + worker * _FIELDS:1 + (worker + 1) * _FIELDS]
        cells.release()
        self._stacks = WorkerStacks(stacks, asks, crash_dumps)
        self._row[2] = time.monotonic_ns()
        self._row[0] = _LOADING  # the main process may ask for its stacks from now on

    def making(self, step: int) -> None:
        """Before making ``step``."""
        row = self._row
        row[1] = step
        row[2] = time.monotonic_ns()
        row[0] = _MAKING

    def stale(self, run: int) -> bool:
        """Whether the pool's run is no longer ``run`` (one read of the table, no syscall)."""
        return self._run[0] != run

    def idle(self) -> None:
        """Between tasks."""
        self._row[2] = time.monotonic_ns()
        self._row[0] = _IDLE

    def close(self) -> None:
        self._stacks.close()
        self._row.release()
        self._run.release()
        self._mapping.close()


_PROCESS_STATES = {"R": "running", "S": "sleeping", "D": "waiting on a disk (uninterruptible)",
                   "T": "stopped (SIGSTOP or SIGTSTP: SIGCONT resumes it)",
                   "t": "stopped by a debugger", "Z": "exited, not yet reaped"}


def process_state(pid: int) -> str:
    """Process ``pid``'s state as the kernel tells it (Linux's ``/proc``), in words."""
    state = _state(pid)
    if state is None:
        return "state unknown"
    return _PROCESS_STATES.get(state, f"state {state}")


def _state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (``R``, ``S``, ``T``, ...), or ``None``."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="surrogateescape") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
