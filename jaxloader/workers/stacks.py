"""Each worker's Python stacks, taken for the main process: a stall report's, and a crashed
worker's.

::

    main process  StackFiles(n): a stack file and a request pipe a worker; their names go to
                  the workers in ``Init`` (``StatusBoard.names``)
    worker        WorkerStacks: a thread of its own, blocked on its pipe, writes every other
                  thread's Python stack to its stack file when the main process writes a byte
                  to that pipe; with ``crash_dumps``, a fatal signal (SIGSEGV, SIGABRT, ...:
                  native code that crashed) has faulthandler write the stacks there, then the
                  signal ends the worker as before
    main process  files.take(asked) ─> each worker's stacks (one stopped, or whose thread
                  holding the GIL in native code keeps the stack thread out: said so);
                  files.crash(w) ─> a crashed worker's, for the error that says it died

The stacks are taken by a thread at a safe point (it holds the GIL, ``sys._current_frames``),
never by a signal: faulthandler's signal handler walks the threads' frames while they change,
and a worker whose code starts and ends threads dies of SIGSEGV within a few dozen such
signals (CPython's issue 116008; on 3.11 and 3.13 here). Nothing is sent to a worker's
threads either, so a blocked system call is not interrupted (no ``EINTR`` in native code) and
a signal handler of the user's own is never called by a report. (A fatal signal's dump is
faulthandler's: the process is ending then, whatever its threads do.)

Example:
    >>> files = StackFiles(1)
    >>> mine = WorkerStacks(*files.names(0))
    >>> files.take([True])[0].startswith('Thread "MainThread"')
    True
    >>> mine.close(); files.destroy()
"""

from __future__ import annotations

import errno
import faulthandler
import os
import secrets
import sys
import tempfile
import threading
import time
import traceback
import warnings
from multiprocessing import resource_tracker
from typing import Any

from jaxloader.base.errors import JaxloaderError, JaxloaderWarning
from jaxloader.runtime import shm
from jaxloader.runtime.descriptors import descriptors_of
from jaxloader.runtime.limits import process_limits

_STACK_WAIT_S = 1.0  # how long a stall report waits for the workers' stacks (their threads)
_STACK_SETTLE_S = 0.02  # a stack file that stopped growing this long is written
_STACK_BYTES = 64 << 10  # at most this much of a worker's stacks is read
_FATAL = b"Fatal Python error: "  # how faulthandler's dump on a fatal signal begins


class StackFiles:
    """The main process's side: a stack file and a request pipe for each of ``num_workers``
    workers."""

    def __init__(self, num_workers: int) -> None:
        self._files: list[tuple[int, str]] = []
        self._asks: list[tuple[int, int, str]] = []  # request pipes: (write end, read end, name)
        try:
            for i in range(num_workers):
                _stack_file(i, self._files)
                _request_pipe(i, self._asks)
        except BaseException:
            self.destroy()
            raise

    def names(self, worker: int) -> tuple[str, str]:
        """What worker ``worker`` opens: (its stack file, its request pipe)."""
        return self._files[worker][1], self._asks[worker][2]

    def clear(self) -> None:
        """Forgets what the workers wrote (new workers: a crash dump is not theirs)."""
        for fd, _ in self._files:
            os.ftruncate(fd, 0)

    def take(self, askable: list[bool]) -> list[str]:
        """The stacks of each worker ``askable`` says may be asked (the first
        ``len(askable)``), written by its stack thread; one not asked, or that does not answer
        within ``_STACK_WAIT_S``, gets a line that says so. A worker not asked keeps its file
        (a dead one's crash dump)."""
        files = [fd for fd, _ in self._files[:len(askable)]]
        asked = []
        for worker, (fd, ask) in enumerate(zip(files, askable)):
            if not ask:
                continue
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
        if worker >= len(self._files):
            return None
        fd = self._files[worker][0]
        size = os.fstat(fd).st_size
        text = os.pread(fd, _STACK_BYTES, max(0, size - _STACK_BYTES))
        at = text.rfind(_FATAL)  # (after a stall report's stacks, if any)
        return None if at < 0 else text[at:].decode("utf-8", "replace").rstrip()

    def destroy(self) -> None:
        """Releases the stack files and the pipes. Idempotent."""
        while self._files:
            fd, path = self._files.pop()
            os.close(fd)
            if not path.startswith("memfd:"):
                _remove(path)
        while self._asks:
            write_end, read_end, name = self._asks.pop()
            os.close(write_end)
            if read_end != write_end:
                os.close(read_end)
            if not name.startswith("pipe:"):  # a FIFO
                _remove(name)


def _stack_file(worker: int, files: list[tuple[int, str]]) -> None:
    """A file for worker ``worker``'s stacks, appended to ``files``: (this process's
    descriptor, the name the worker opens it by). A memory file where there are, else a file
    in /dev/shm the resource tracker unlinks if this process is killed (``_tracked``), else a
    temporary file. Appended in the ``try`` that makes it, which a Ctrl-C cut short releases
    by the file's token (``jaxloader.base.interrupts``, 3): one left open was seen in 1 of 4
    runs of 40 interrupts fired as loaders were made."""
    if shm.MEMFD_AVAILABLE:
        # (named by its loader's process too: what holds it is found by name, in /proc)
        token = f"{shm.PREFIX}_stack_{os.getpid()}_{worker}_{secrets.token_hex(4)}"
        fd = -1
        try:
            fd = os.memfd_create(token, os.MFD_CLOEXEC)
            files.append((fd, f"memfd:{os.getpid()}:{fd}:{os.fstat(fd).st_ino}"))
        except BaseException:
            if not files or files[-1][0] != fd:
                for leftover in [fd] if fd >= 0 else descriptors_of(token):
                    os.close(leftover)
            raise
        return
    if _shm_dir_writable():
        if _tracked(f"stack_{os.getpid()}_{worker}", lambda path: os.open(
                path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600), files):
            return
    fd, path = _temporary(tempfile.mkstemp, f"{shm.PREFIX}_stack_{worker}_")
    files.append((fd, path))


def _shm_dir_writable() -> bool:
    """Whether files can be made in /dev/shm (where there is one: Linux's)."""
    return os.access(_SHM_DIR, os.W_OK | os.X_OK)


_SHM_DIR = "/dev/shm"  # POSIX shared memory's folder (Linux): Python's resource tracker
# unlinks a file there that a killed loader left, as it does the loader's POSIX segments


def _tracked(kind: str, make: Any, made: list, both: bool = False) -> str | None:
    """A file ``make(path)`` makes and opens in /dev/shm, appended to ``made`` as
    ``(its descriptor, path)`` (``both``: ``(it, it, path)``, a FIFO's two ends in one
    descriptor) and registered with the resource tracker, which unlinks it if
    this process is killed (SIGKILL, SIGTERM: a temporary file was left in $TMPDIR for good);
    ``None`` where /dev/shm refused it (the caller's fallback is tried)."""
    name = f"{shm.PREFIX}_{kind}_{secrets.token_hex(4)}"
    path = os.path.join(_SHM_DIR, name)
    fd, registered = None, False
    try:
        fd = make(path)
        # (noted in the same line: a name unregistered that was not registered is a
        # traceback of the tracker's, one registered and unlinked a warning at exit)
        registered = resource_tracker.register("/" + name, "shared_memory") or True
        made.append((fd, fd, path) if both else (fd, path))
    except BaseException as e:
        if made and made[-1][-1] == path:
            raise  # (appended: the caller's cleanup releases it)
        if fd is not None:
            os.close(fd)
        if not isinstance(e, FileExistsError) and os.path.lexists(path):  # (ours: made, then
            os.unlink(path)  # a failure or a Ctrl-C before it was noted)
        if registered:
            resource_tracker.unregister("/" + name, "shared_memory")
        if isinstance(e, OSError) and e.errno in (errno.EROFS, errno.EACCES, errno.ENOSPC,
                                                   errno.ENOENT, errno.EPERM):
            return None
        raise
    return path


def _remove(path: str) -> None:
    """Unlinks a file ``_tracked`` or ``_temporary`` made (and its folder, a FIFO's own); one
    gone already (``rm /dev/shm/jaxloader*``, systemd's RemoveIPC at logout) is let go."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    folder, name = os.path.split(path)
    if folder == _SHM_DIR:
        resource_tracker.unregister("/" + name, "shared_memory")
    elif name == "ask":
        os.rmdir(folder)


def _temporary(make: Any, prefix: str) -> Any:
    """``make(prefix=prefix)`` (``tempfile``'s), or the error that names the folder to give
    (a read-only container without a writable /tmp: a bare "No usable temporary directory
    found", the containers audit)."""
    try:
        return make(prefix=prefix)
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):  # (the descriptor table's: said as such
            raise  # where the workers start, not as a folder to give; the review)
        raise JaxloaderError(
            f"the workers' stack files: no writable temporary folder ({e}); where memory files "
            "cannot be made (no /proc, or refused), each worker has a file there for its "
            "stacks: set TMPDIR to a writable folder (in a container: --tmpfs /tmp), or use "
            "num_workers=0") from e


def _request_pipe(worker: int, asks: list[tuple[int, int, str]]) -> None:
    """A pipe through which the main process asks worker ``worker`` for its stacks, appended
    to ``asks`` as it is made: (this process's write end, non-blocking; its read end; the name
    the worker opens a read end by). Where ``/proc`` is, an anonymous pipe opened through it;
    else a FIFO in /dev/shm (``_tracked``), or in a temporary directory of its own, held open
    ``O_RDWR`` (both ends in one descriptor). This process holds a read
    end too, so a request made before the worker opens its own is kept for it."""
    if shm.PROC_FDS:
        read_end, write_end = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        # (the worker's open through /proc is a file of its own: blocking, whatever these are)
        asks.append((write_end, read_end,
                     f"pipe:{os.getpid()}:{read_end}:{os.fstat(read_end).st_ino}"))
        return
    if _shm_dir_writable():
        def fifo(path: str) -> int:
            os.mkfifo(path, 0o600)
            return os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)

        if _tracked(f"ask_{os.getpid()}_{worker}", fifo, asks, both=True) is not None:
            return  # (noted in asks as it was made: a Ctrl-C after is StackFiles' to undo)
    directory = _temporary(tempfile.mkdtemp, f"{shm.PREFIX}_ask_{worker}_")
    path = os.path.join(directory, "ask")
    try:
        os.mkfifo(path, 0o600)
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    except BaseException:
        if os.path.exists(path):
            os.unlink(path)
        os.rmdir(directory)
        raise
    asks.append((fd, fd, path))


class WorkerStacks:
    """A worker's side: its stack thread, answering the main process's requests."""

    def __init__(self, stacks: str, asks: str, crash_dumps: bool = False) -> None:
        """``stacks``, ``asks``: ``StackFiles.names``; ``crash_dumps``: a fatal signal (native
        code that crashed) writes this process's stacks where ``StackFiles.crash`` reads them
        (faulthandler, for the process's life: a worker's own)."""
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
        try:
            threading.Thread(target=self._answer_requests, args=(ask_fd,),
                             name="jaxloader-stacks", daemon=True).start()
        except RuntimeError as e:  # (a bare "can't start new thread")
            for fd in (ask_fd, *(() if crash_dumps else (stack_fd,))):
                os.close(fd)
            # The worker goes on without it: its batches need no thread of their own (it ended
            # the worker, and so the run, where num_workers="auto" added one at the limit).
            warnings.warn(
                f"{e}: this worker's stack thread (its stacks, for stall reports) could not "
                f"start: this user's processes and threads are at their limit "
                f"({process_limits()}), or memory is short; it makes batches without it, and a "
                "stall report holds no stack of it: raise the limit, or use fewer workers",
                JaxloaderWarning, stacklevel=2)

    def close(self) -> None:
        self._closed.set()

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
