"""What each worker is doing, for the main process to say when a worker dies or a batch is late.

::

    main process  StatusBoard(n): a shared table, a row a worker (state, step, since), and a
                  stack file a worker; their names go to the workers in ``Init``
    worker        WorkerStatus: making(step) before it makes a step (no message, no syscall:
                  three stores into the table), idle() when its task is done;
                  faulthandler writes every thread's Python stack to its file on SIGUSR2
    main process  board.doing(w) ─> "making step 25 (epoch 0, record positions ...) for 312 s"
                  board.stacks(pids) ─> each worker's stack, taken by signal (a worker stopped
                  or stuck in native code without its handler answers nothing: said so)

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

import faulthandler
import os
import signal
import tempfile
import time
from typing import Any, Callable

import numpy as np

from jaxloader.runtime import shm

_FIELDS = 3  # a worker's row: state, step, since
# starting: not yet able to answer STACK_SIGNAL (its default action would end the process);
# loading: its handler is in, its payload and worker_init_fn are loading
_IDLE, _MAKING, _STARTING, _LOADING = 0, 1, 2, 3
STACK_SIGNAL = signal.SIGUSR2
_STACK_WAIT_S = 1.0  # how long a stall report waits for the workers' stacks (signal handlers)
_STACK_SETTLE_S = 0.02  # a stack file that stopped growing this long is written
_STACK_BYTES = 64 << 10  # at most this much of a worker's stacks is read


class StatusBoard:
    """The main process's side: the table and the stack files of ``num_workers`` workers."""

    def __init__(self, num_workers: int) -> None:
        self._segment = shm.Segment.create(num_workers * _FIELDS * 8)
        self._rows = np.frombuffer(self._segment.memory, np.int64)[:num_workers * _FIELDS]
        self._rows = self._rows.reshape(num_workers, _FIELDS)
        self._stacks: list[tuple[int, str]] = []
        try:
            for i in range(num_workers):
                self._stacks.append(_stack_file(i))
        except BaseException:
            self.destroy()
            raise
        self.restarted()

    def names(self, worker: int) -> tuple[str, int, str]:
        """What worker ``worker`` opens: (the table's name, its size, its stack file)."""
        return self._segment.name, self._segment.size, self._stacks[worker][1]

    def restarted(self) -> None:
        """Every worker is starting (new ones: at first, or after an interrupted run)."""
        self._rows[:, 0] = _STARTING
        self._rows[:, 2] = time.monotonic_ns()

    def making(self, worker: int) -> int | None:
        """The step worker ``worker`` is making, or ``None``."""
        state, step, _ = (int(v) for v in self._rows[worker])
        return step if state == _MAKING else None

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
        """Each worker's Python stacks, taken by ``STACK_SIGNAL``; a worker that is stopped,
        or does not answer within ``_STACK_WAIT_S``, gets a line that says so."""
        files = [fd for fd, _ in self._stacks[:len(pids)]]
        asked = []
        for worker, (fd, pid) in enumerate(zip(files, pids)):
            os.ftruncate(fd, 0)
            if _state(pid) in ("T", "t", "Z", None) or self._rows[worker, 0] == _STARTING:
                continue  # it cannot answer now (a worker starting would die of the signal)
            try:
                os.kill(pid, STACK_SIGNAL)
            except ProcessLookupError:
                continue
            asked.append(fd)
        deadline = time.monotonic() + _STACK_WAIT_S
        sizes = [-1] * len(asked)
        while asked and time.monotonic() < deadline:
            now = [os.fstat(fd).st_size for fd in asked]
            if all(now) and now == sizes:
                break
            sizes = now
            time.sleep(_STACK_SETTLE_S)
        out = []
        for fd in files:
            text = os.pread(fd, _STACK_BYTES, 0).decode("utf-8", "replace").rstrip()
            if not text:
                text = (f"(no stack: no answer to signal {STACK_SIGNAL.name} within "
                        f"{_STACK_WAIT_S} s: busy in native code that holds the signal back?)"
                        if fd in asked else "(no stack: the process is stopped, gone, or not "
                        "yet able to answer)")
            out.append(text)
        return out

    def destroy(self) -> bool:
        """Releases the table and the stack files. Idempotent."""
        while self._stacks:
            fd, path = self._stacks.pop()
            os.close(fd)
            if not path.startswith("memfd:"):
                os.unlink(path)
        self._rows = np.zeros((0, _FIELDS), np.int64)  # the view goes: the mapping can close
        return self._segment.destroy()


def _stack_file(worker: int) -> tuple[int, str]:
    """A file for worker ``worker``'s stacks: (this process's descriptor, the name the worker
    opens it by). A memory file where there are, else a temporary file."""
    if shm.MEMFD_AVAILABLE:
        # (named by its loader's process too: what holds it is found by name, in /proc)
        fd = os.memfd_create(f"{shm.PREFIX}_stack_{os.getpid()}_{worker}", os.MFD_CLOEXEC)
        return fd, f"memfd:{os.getpid()}:{fd}:{os.fstat(fd).st_ino}"
    fd, path = tempfile.mkstemp(prefix=f"{shm.PREFIX}_stack_{worker}_")
    return fd, path


class WorkerStatus:
    """A worker's side: its row of the table, and its stacks written on ``STACK_SIGNAL``."""

    def __init__(self, names: tuple[str, int, str], worker: int) -> None:
        table, size, stacks = names
        self._mapping: Any = shm.attach(table, size)
        self._row = memoryview(self._mapping).cast("q")[worker * _FIELDS:(worker + 1) * _FIELDS]
        if stacks.startswith("memfd:"):
            fd = shm.open_memory_file(*shm.memory_file_name(stacks), os.O_WRONLY | os.O_APPEND)
            if fd is None:
                raise OSError(f"worker status: the stack file {stacks} is gone")
        else:
            fd = os.open(stacks, os.O_WRONLY | os.O_APPEND)
        self._stack_fd = fd
        faulthandler.register(STACK_SIGNAL, file=fd, all_threads=True, chain=False)
        self._row[2] = time.monotonic_ns()
        self._row[0] = _LOADING  # the main process may ask for its stacks from now on

    def making(self, step: int) -> None:
        """Before making ``step``."""
        row = self._row
        row[1] = step
        row[2] = time.monotonic_ns()
        row[0] = _MAKING

    def idle(self) -> None:
        """Between tasks."""
        self._row[2] = time.monotonic_ns()
        self._row[0] = _IDLE

    def close(self) -> None:
        faulthandler.unregister(STACK_SIGNAL)
        os.close(self._stack_fd)
        self._row.release()
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
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
