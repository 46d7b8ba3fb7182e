"""What each worker is doing, for the main process to say when a worker dies or a batch is late.

::

    main process  StatusBoard(n): a shared table, a row a worker (state, step, since), and a
                  stack file a worker; their names go to the workers in ``Init``
    worker        WorkerStatus: making(step) before it makes a step (no message, no syscall:
                  three stores into the table), idle() when its task is done; a thread of its
                  own, blocked on a pipe, writes every other thread's Python stack to the
                  worker's stack file when the main process writes a byte to that pipe
    main process  board.doing(w) ─> "making step 25 (epoch 0, record positions ...) for 312 s"
                  board.stacks(pids) ─> each worker's stacks (a worker stopped, or whose
                  thread holding the GIL in native code keeps the stack thread out, answers
                  nothing: said so)
    worker        a fatal signal (SIGSEGV, SIGABRT, SIGBUS, ...: native code that crashed):
                  faulthandler writes every thread's stack to the stack file, then the
                  signal ends the worker as before
    main process  board.crash(w) ─> those stacks, for the error that says the worker died

The table is written by the worker before it starts a step, so a worker that dies names the
step it died in, not its task's first; a stall report names what each worker holds and for
how long. ``since`` is ``CLOCK_MONOTONIC`` in nanoseconds, one clock for every process.

The stacks are taken by a thread at a safe point (it holds the GIL, ``sys._current_frames``),
never by a signal: faulthandler's signal handler walks the threads' frames while they change,
and a worker whose code starts and ends threads dies of SIGSEGV within a few dozen such
signals (CPython's issue 116008; on 3.11 and 3.13 here). Nothing is sent to a worker's
threads either, so a blocked system call is not interrupted (no ``EINTR`` in native code) and
a signal handler of the user's own is never called by a report. (A fatal signal's dump is
faulthandler's: the process is ending then, whatever its threads do.)

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
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable

import numpy as np

from jaxloader.runtime import shm

_FIELDS = 3  # a worker's row: state, step, since
# starting: its stack thread not yet started (asked now, it would answer at some later time);
# loading: its stack thread runs, its payload and worker_init_fn are loading
_IDLE, _MAKING, _STARTING, _LOADING = 0, 1, 2, 3
_STACK_WAIT_S = 1.0  # how long a stall report waits for the workers' stacks (their threads)
_STACK_SETTLE_S = 0.02  # a stack file that stopped growing this long is written
_STACK_BYTES = 64 << 10  # at most this much of a worker's stacks is read
_FATAL = b"Fatal Python error: "  # how faulthandler's dump on a fatal signal begins


class StatusBoard:
    """The main process's side: the table and the stack files of ``num_workers`` workers."""

    def __init__(self, num_workers: int) -> None:
        self._segment = shm.Segment.create(num_workers * _FIELDS * 8)
        self._rows = np.frombuffer(self._segment.memory, np.int64)[:num_workers * _FIELDS]
        self._rows = self._rows.reshape(num_workers, _FIELDS)
        self._stacks: list[tuple[int, str]] = []
        self._asks: list[tuple[int, int, str]] = []  # request pipes: (write end, read end, name)
        try:
            for i in range(num_workers):
                self._stacks.append(_stack_file(i))
                self._asks.append(_request_pipe(i))
        except BaseException:
            self.destroy()
            raise
        self.restarted()

    def names(self, worker: int) -> tuple[str, int, str, str]:
        """What worker ``worker`` opens: (the table's name, its size, its stack file, its
        request pipe)."""
        return (self._segment.name, self._segment.size, self._stacks[worker][1],
                self._asks[worker][2])

    def restarted(self) -> None:
        """Every worker is starting (new ones: at first, or after an interrupted run); what
        the workers before wrote is gone (a crash dump is not a new worker's)."""
        self._rows[:, 0] = _STARTING
        self._rows[:, 2] = time.monotonic_ns()
        for fd, _ in self._stacks:
            os.ftruncate(fd, 0)

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
        """Each worker's Python stacks, written by its stack thread when asked; a worker that
        is stopped, or does not answer within ``_STACK_WAIT_S``, gets a line that says so."""
        files = [fd for fd, _ in self._stacks[:len(pids)]]
        asked = []
        for worker, (fd, pid) in enumerate(zip(files, pids)):
            if _state(pid) in ("T", "t", "Z", None) or self._rows[worker, 0] == _STARTING:
                continue  # it cannot answer now (and a dead one's crash dump stays)
            os.ftruncate(fd, 0)
            try:
                os.write(self._asks[worker][0], b"?")
            except BlockingIOError:  # a pipe full of unanswered requests: asked already
                pass
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
            if fd not in asked:
                out.append("(no stack: the process is stopped, gone, or not yet able to answer)")
                continue
            text = os.pread(fd, _STACK_BYTES, 0).decode("utf-8", "replace").rstrip()
            out.append(text or f"(no stack: no answer within {_STACK_WAIT_S} s: a thread busy "
                               "in native code that holds the GIL? `py-spy dump --pid` reads "
                               "a process's stacks from outside)")
        return out

    def crash(self, worker: int) -> str | None:
        """The stacks worker ``worker`` wrote as a fatal signal ended it (faulthandler's
        dump: the signal, then each thread's stack, most recent call first), or ``None``."""
        if worker >= len(self._stacks):
            return None
        fd = self._stacks[worker][0]
        size = os.fstat(fd).st_size
        text = os.pread(fd, _STACK_BYTES, max(0, size - _STACK_BYTES))
        at = text.rfind(_FATAL)  # (after a stall report's stacks, if any)
        return None if at < 0 else text[at:].decode("utf-8", "replace").rstrip()

    def destroy(self) -> bool:
        """Releases the table and the stack files. Idempotent."""
        while self._stacks:
            fd, path = self._stacks.pop()
            os.close(fd)
            if not path.startswith("memfd:"):
                os.unlink(path)
        while self._asks:
            write_end, read_end, name = self._asks.pop()
            os.close(write_end)
            if read_end != write_end:
                os.close(read_end)
            if not name.startswith("pipe:"):  # a FIFO in a directory of its own
                os.unlink(name)
                os.rmdir(os.path.dirname(name))
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


def _request_pipe(worker: int) -> tuple[int, int, str]:
    """A pipe through which the main process asks worker ``worker`` for its stacks: (this
    process's write end, non-blocking; its read end; the name the worker opens a read end
    by). Where ``/proc`` is, an anonymous pipe opened through it; else a FIFO in a directory
    of its own, held open ``O_RDWR`` (both ends in one descriptor). This process holds a read
    end too, so a request made before the worker opens its own is kept for it."""
    if shm.MEMFD_AVAILABLE:
        read_end, write_end = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        # (the worker's open through /proc is a file of its own: blocking, whatever these are)
        return write_end, read_end, f"pipe:{os.getpid()}:{read_end}:{os.fstat(read_end).st_ino}"
    directory = tempfile.mkdtemp(prefix=f"{shm.PREFIX}_ask_{worker}_")
    path = os.path.join(directory, "ask")
    try:
        os.mkfifo(path, 0o600)
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    except BaseException:
        if os.path.exists(path):
            os.unlink(path)
        os.rmdir(directory)
        raise
    return fd, fd, path


class WorkerStatus:
    """A worker's side: its row of the table, and its stack thread (module docstring)."""

    def __init__(self, names: tuple[str, int, str, str], worker: int,
                 crash_dumps: bool = False) -> None:
        """``crash_dumps``: a fatal signal (native code that crashed) writes this process's
        stacks where ``StatusBoard.crash`` reads them (faulthandler, for the process's life:
        a worker's own)."""
        table, size, stacks, asks = names
        self._mapping: Any = shm.attach(table, size)
        self._row = memoryview(self._mapping).cast("q")[worker * _FIELDS:(worker + 1) * _FIELDS]
        stack_fd = _open_named(stacks, "memfd:", os.O_WRONLY | os.O_APPEND)
        try:
            # (non-blocking to open: a pipe without a writer would block the open forever)
            ask_fd = _open_named(asks, "pipe:", os.O_RDONLY | os.O_NONBLOCK)
            os.set_blocking(ask_fd, True)
        except BaseException:
            os.close(stack_fd)
            raise
        self._stack_fd = stack_fd
        self._closed = threading.Event()
        self._crash_dumps = crash_dumps  # (faulthandler then holds stack_fd)
        if crash_dumps:
            faulthandler.enable(stack_fd, all_threads=True)
        # (its descriptors are the thread's, closed by it as it ends: closed under a thread
        # that may still write, a number reused by another file would get the stacks)
        threading.Thread(target=self._answer_requests, args=(ask_fd,), name="jaxloader-stacks",
                         daemon=True).start()
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
        self._closed.set()
        self._row.release()
        self._mapping.close()

    def _answer_requests(self, ask_fd: int) -> None:
        """The stack thread: for each request read from ``ask_fd``, every other thread's
        stack appended to the stack file; ends when the main process's ends of the pipe are
        gone, or at the first request after ``close()``."""
        try:
            while os.read(ask_fd, 64) and not self._closed.is_set():  # (queued: one answer)
                os.write(self._stack_fd, format_stacks().encode("utf-8", "replace"))
        except OSError:
            pass
        finally:
            os.close(ask_fd)
            if not self._crash_dumps:
                os.close(self._stack_fd)


def _open_named(name: str, proc_prefix: str, flags: int) -> int:
    """A descriptor of the main process's file ``name``: ``<proc_prefix><pid>:<fd>:<inode>``,
    opened through ``/proc``, or a path."""
    if not name.startswith(proc_prefix):
        return os.open(name, flags | os.O_CLOEXEC)
    fd = shm.open_memory_file(*shm.memory_file_name(name), flags)
    if fd is None:
        raise OSError(f"worker status: {name} is gone")
    return fd


def format_stacks() -> str:
    """Every thread's Python stack but the calling thread's, the main thread first, each
    most recent call first (as faulthandler writes them), with its source lines. Taken with
    the GIL held (``sys._current_frames``): each frame whole.

    Example:
        >>> import threading
        >>> out = []
        >>> t = threading.Thread(target=lambda: out.append(format_stacks())); t.start(); t.join()
        >>> out[0].startswith('Thread "MainThread"') and "in <module>" in out[0]
        True
    """
    names = {t.ident: t.name for t in threading.enumerate()}
    me, main = threading.get_ident(), threading.main_thread().ident
    frames = sorted(sys._current_frames().items(), key=lambda item: item[0] != main)
    parts = []
    for ident, frame in frames:
        if ident == me:
            continue
        parts.append(f'Thread "{names.get(ident, "?")}" ({ident:#x}), most recent call first:\n')
        parts.extend(reversed(traceback.format_stack(frame)))  # (where it waits: on top)
    return "".join(parts)


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
