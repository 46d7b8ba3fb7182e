"""The starter: one fresh interpreter a training process keeps to start its ``"exec"`` workers
by forking itself, so that each worker costs a fork instead of an interpreter and its imports.

A worker started by ``subprocess`` runs a new interpreter, then imports NumPy and jaxloader:
0.3-0.5 s of CPU on a 2-core machine, for every worker of every loader, every restart and
every change of ``num_workers="auto"``. The starter pays that once (at the first worker of the
process); a worker is then a fork of it, ready in milliseconds. What a worker is does not
change: the starter was started as an exec'd worker is (``process.worker_environment``), never
runs the user's code, never imports JAX and has one thread, so each fork of it starts from a
fresh interpreter's state, in the training process's current directory of the moment (passed
with each request). NumPy's global random state, which a fork would share, is seeded anew in
each worker (Python's ``random`` reseeds itself after a fork).

Why not ``multiprocessing``'s ``"forkserver"``, the same idea: its children prepare themselves
by importing the parent's ``__main__`` by path, which runs an unguarded script's top level
again (a second ``jax.distributed.initialize()``), the thing ``"exec"`` exists to avoid; and
its processes are ``multiprocessing.Process`` objects, whose pipes and exit codes the pool
already has its own way to read (``process.WorkerProcess``).

The link is a Unix socket of ordered messages (``SOCK_SEQPACKET``, Linux): a request is a pickled
tuple, numbered; a worker's end of its pipe goes with the request that starts it
(``SCM_RIGHTS``). Requests: ``start`` (the worker's pid back) and ``poll`` (its exit code once
it has exited: the starter is the worker's parent and reaps it). A reply to a request that an
interrupt cut short is recognised by its number and dropped.

Lifetimes: the starter is started from a thread that lasts as long as the process
(``process._in_lasting_thread``) and dies with the training process
(``worker.die_with_parent``), and its workers die with it the same way: a killed training
process leaves none of them. It ends when the training process closes its end (at exit). One
starter per worker environment: a process whose environment changes (``OPENBLAS_NUM_THREADS``
set between two loaders) gets a second one, since a fork would keep the libraries the first
loaded under the old one. Only on Linux; elsewhere workers are exec'd one by one.

Example:
    >>> import os, sys
    >>> from multiprocessing.connection import Pipe
    >>> from jaxloader.workers.process import worker_environment
    >>> starter = starter_for(worker_environment(os.environ))
    >>> ours, theirs = Pipe()
    >>> pid = starter.start(theirs.fileno(), os.getcwd()); theirs.close()
    >>> ours.close()  # (the worker sees its pipe's end and exits)
    >>> code = None
    >>> while code is None:
    ...     code = starter.poll(pid)
    >>> code
    0
"""

from __future__ import annotations

import itertools
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from typing import Any, Mapping

AVAILABLE = sys.platform.startswith("linux") and hasattr(socket, "SOCK_SEQPACKET")
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BOOT = (
    "import sys; sys.path.insert(0, {root!r}); "
    "from jaxloader.workers.starter import serve; serve({fd}, {parent})"
)
_MESSAGE = 1 << 16  # a request or a reply is a small tuple
_ENDED = -signal.SIGKILL  # a worker whose starter ended: killed with it (die_with_parent)


class Starter:
    """A started starter process: ``start`` a worker on a pipe's end, ``poll`` its exit code.
    Safe to call from several threads (one request at a time)."""

    def __init__(self, environment: Mapping[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            boot = _BOOT.format(root=_PACKAGE_ROOT, fd=theirs.fileno(), parent=os.getpid())
            self._popen = subprocess.Popen([sys.executable, "-c", boot],
                                           pass_fds=(theirs.fileno(),), env=dict(environment))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.pid = self._popen.pid
        self._socket = ours
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        self.ended = False

    def start(self, fd: int, cwd: str | None) -> int:
        """Forks a worker serving the pipe end ``fd`` (a duplicate goes to it; the caller
        closes its own) in directory ``cwd`` (None: the starter's); its pid. ``OSError`` if
        it could not."""
        reply = self._ask(("start", cwd), fd)
        if reply[0] != "started":
            raise OSError(f"the worker starter (pid {self.pid}) could not start a worker: "
                          f"{reply[1]}")
        return int(reply[1])

    def poll(self, pid: int) -> int | None:
        """The exit code of worker ``pid`` (negative: killed by that signal), None while it
        runs. A worker whose starter has ended ended with it (SIGKILL)."""
        if self.ended:
            return _ENDED
        try:
            return self._ask(("poll", pid))[1]
        except (EOFError, OSError):
            return _ENDED

    def _ask(self, request: tuple, fd: int | None = None) -> tuple:
        with self._lock:
            number = next(self._numbers)
            message = [pickle.dumps((number, *request))]
            try:
                if fd is None:
                    self._socket.sendmsg(message)
                else:
                    socket.send_fds(self._socket, message, [fd])
                while True:
                    data = self._socket.recv(_MESSAGE)
                    if not data:
                        raise EOFError(f"the worker starter (pid {self.pid}) has ended")
                    reply = pickle.loads(data)
                    if reply[0] == number:  # (others: replies to requests cut short)
                        return reply[1:]
            except (EOFError, OSError):
                self.ended = True
                raise

    def close(self) -> None:
        """Closes the link: the starter exits, and workers it started exit with it."""
        self.ended = True
        self._socket.close()


_STARTERS: dict[tuple, Starter] = {}
_LOCK = threading.Lock()


def starter_for(environment: Mapping[str, str]) -> Starter:
    """The starter of workers with ``environment`` (``process.worker_environment``), started
    if there is none (or it has ended). Call it from a thread that lasts as long as the process
    (the starter dies with the thread that started it)."""
    key = (sys.executable, tuple(sorted(environment.items())))
    with _LOCK:
        starter = _STARTERS.get(key)
        if starter is None or starter.ended:
            starter = _STARTERS[key] = Starter(environment)
        return starter


def _forget_starters() -> None:
    """In a forked child: the parent's starters answer the parent (and its lock may be held)."""
    global _LOCK
    _STARTERS.clear()
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_starters)


# -- in the starter process --------------------------------------------------------------------
def serve(fd: int, parent: int) -> None:
    """The starter's main: imports what every worker imports, then answers requests until the
    training process (``parent``) closes its end."""
    import importlib

    from jaxloader.workers import worker

    importlib.import_module("numpy.random")  # (a RandomMap's generators: imported once for all)

    worker.die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a terminal's Ctrl-C is the trainer's)
    link = socket.socket(fileno=fd)
    exited: dict[int, int] = {}
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(link, _MESSAGE, 1)
        except (ConnectionResetError, OSError):
            return
        if not data:
            return
        number, kind, argument = pickle.loads(data)
        reply: tuple[Any, ...]
        if kind == "start":
            reply = _forked(link, fds[0], argument)
        else:
            reply = ("exit", _reaped(argument, exited))
        link.sendmsg([pickle.dumps((number, *reply))])


def _forked(link: socket.socket, fd: int, cwd: str | None) -> tuple[str, Any]:
    """A worker forked on pipe end ``fd`` in ``cwd`` (one removed since: the starter's, as
    an exec'd worker would be in a directory that is gone): ``("started", pid)`` or
    ``("failed", why)``."""
    try:
        pid = os.fork()
    except OSError as e:
        os.close(fd)
        return "failed", f"{type(e).__name__}: {e}"
    if pid:
        os.close(fd)
        return "started", pid
    code = 1  # the child: a worker, which leaves without the starter's exit path
    try:
        link.close()
        if cwd is not None and os.path.isdir(cwd):
            os.chdir(cwd)
        if "numpy.random" in sys.modules:  # (a fork shares its random state with its siblings)
            sys.modules["numpy.random"].seed()
        from jaxloader.workers.worker import main

        main(fd, os.getppid())
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - printed, as an exec'd worker's interpreter would
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream: nothing to keep
                pass
        os._exit(code)


def _reaped(pid: int, exited: dict[int, int]) -> int | None:
    """Worker ``pid``'s exit code if it has exited (reaped then), else None."""
    if pid not in exited:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return _ENDED  # (not one of this starter's: nothing to wait for)
        if not done:
            return None
        exited[pid] = os.waitstatus_to_exitcode(status)
    return exited[pid]
