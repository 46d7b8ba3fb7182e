"""The starter: one fresh interpreter a training process keeps to start its ``"exec"`` workers
by forking itself, so that each worker costs a fork instead of an interpreter and its imports.

A worker started by ``subprocess`` runs a new interpreter, then imports NumPy and jaxloader:
0.3-0.5 s of CPU on a 2-core machine, for every worker of every loader, every restart and
every change of ``num_workers="auto"``. The starter pays that once (at the first worker of the
process); a worker is then a fork of it, ready in milliseconds. A worker is what an exec'd
one was: the starter was started as one is (``process.worker_environment``), never runs the
user's code, never imports JAX, and forks from its one Python thread, so each worker starts
from a fresh interpreter's state. With each request go the training process's current
directory, standard output and error of the moment; its environment picks the starter. NumPy's
global random state, which a fork would share, is seeded anew in each worker (Python's
``random`` reseeds itself after a fork). What comes from the starter's start instead: resource
limits, umask, CPU affinity and the hash seed (one for all workers). A worker forked from it
ends as an exec'd one does (``worker.run``: atexit hooks, threads and streams, exit code and
traceback, without the interpreter's teardown of its modules).

Why not ``multiprocessing``'s ``"forkserver"``, the same idea: its children import the parent's
``__main__`` by path, which runs an unguarded script's top level again (a second
``jax.distributed.initialize()``), what ``"exec"`` exists to avoid; and its processes are
``multiprocessing.Process`` objects, whose pipes and exit codes the pool reads its own way.

The link is a Unix socket of ordered messages (``SOCK_SEQPACKET``, Linux): a request is a
pickled tuple, numbered; a worker's end of its pipe (and the standard streams) go with the
request that starts it (``SCM_RIGHTS``). Requests: ``start`` (the worker's pid back), ``poll``
(its exit code once it has exited: the starter reaps it then, not before, so that its pid is not
another process's while the pool may still signal it) and ``children`` (those not reaped). A
reply to a request an interrupt cut short is known by its number and dropped; a worker of a start
cut short (the pool never learned its pid: named in such a reply, or among the children after
a reply read as the interrupt came) is asked after by this end until it has been reaped.

Lifetimes: the starter is started from a thread that lasts as long as the process
(``spawner.in_lasting_thread``) and dies with the training process, killing its workers'
process groups first (``ties.die_with_parent_ending``: the programs their transforms run go
too); its workers die with it: a killed training process leaves none of them
(``starter_process``, the starter's side). It ends when the training process closes its end
(at exit). One starter per worker environment: a process whose environment changes (``OPENBLAS_NUM_THREADS``
set between two loaders) gets a new one, since a fork would keep the libraries the first
loaded under the old one; the old one is closed once none of its workers runs. A starter that
has ended (killed) is replaced at the next worker's start. Linux only (elsewhere: exec'd).

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

import atexit
import errno
import itertools
import os
import pickle
import socket
import subprocess
import sys
import threading
from typing import Any, Mapping, Sequence

from jaxloader.base.errors import JaxloaderError
from jaxloader.runtime.limits import memory_left, process_limits
from jaxloader.workers import launch, protocol
from jaxloader.workers.starter_process import ENDED, MESSAGE_BYTES

AVAILABLE = sys.platform.startswith("linux") and hasattr(socket, "SOCK_SEQPACKET")
_BOOT = ("__jaxloader_boot__ = 1; from jaxloader.workers.starter_process import serve; "
         "serve({fd}, {parent})")
_ANSWER_S = 30.0  # a starter that does not answer (stopped, stuck) is taken as ended


class Starter:
    """A started starter process: ``start`` a worker on a pipe's end, ``poll`` its exit code.
    Safe to call from several threads (one request at a time)."""

    def __init__(self, environment: Mapping[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            boot = _BOOT.format(fd=theirs.fileno(), parent=os.getpid())
            self._popen = launch.launch(boot, pass_fds=(theirs.fileno(),),
                                        env=dict(environment))
        except BaseException as e:
            ours.close()
            if isinstance(e, OSError) and e.errno in (errno.EAGAIN, errno.ENOMEM):
                held = process_limits() if e.errno == errno.EAGAIN else memory_left()
                raise OSError(e.errno, f"could not start the worker starter process "
                              f"({e.strerror}): free processes or memory ({held}), or use "
                              "num_workers=0 (no worker processes)") from e  # (a bare
            raise  # BlockingIOError under a container's --pids-limit: the containers audit)
        finally:
            theirs.close()
        ours.settimeout(_ANSWER_S)
        self.pid = self._popen.pid
        self._socket = ours
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        self._running: set[int] = set()  # its workers not yet seen to have exited
        self._orphans: set[int] = set()  # those of starts cut short (no pool knows them)
        self._lost_start = False  # a start cut short as its reply was read: worker unknown
        self._starting = 0  # starts asked for, their pids not yet in _running
        self._tally = threading.Lock()  # (for _starting: starts may come from several threads)
        self._ended = False

    @property
    def ended(self) -> bool:  # (closed, or its process has exited)
        if not self._ended and launch.exit_code(self._popen) is not None:
            self._end()
        return self._ended

    def exit_code(self) -> int | None:
        """The starter's exit code (negative: killed by that signal; or
        ``launch.EXIT_UNKNOWN``); None while it runs."""
        return launch.exit_code(self._popen)

    @property
    def idle(self) -> bool:
        """Whether none of its workers may still run: those not yet seen to have exited are
        asked after (and reaped), as a worker that outlived ``close()``'s wait was not."""
        for pid in list(self._running):
            self.poll(pid)
        return not self._running and not self._starting

    def start(self, fd: int, cwd: str | None) -> int:
        """Forks a worker serving the pipe end ``fd`` (a duplicate goes to it; the caller
        closes its own) in directory ``cwd`` (None: the starter's), its standard output and
        error this process's of the moment; its pid. ``OSError`` if it could not."""
        std = [n for n in (1, 2) if launch.is_open(n)]
        with self._tally:  # (not idle: another environment's first start must not close it)
            self._starting += 1
        try:
            try:
                reply = self._ask(("start", (cwd, std)), [fd, *std])
            except BaseException:  # (a Ctrl-C as its reply was read: the worker unknown)
                self._lost_start = True
                raise
            if reply[0] != "started":
                raise OSError(f"the worker starter (pid {self.pid}) could not fork a worker: "
                              f"{reply[1]}; free memory or processes ({process_limits()}), or "
                              "ask for fewer num_workers")
            self._running.add(reply[1])
        finally:
            with self._tally:
                self._starting -= 1
        try:
            self._ask_after_orphans()
        except BaseException:  # (a Ctrl-C there: the worker started, its pool not told)
            self._orphans.add(reply[1])
            raise
        return int(reply[1])

    def poll(self, pid: int) -> int | None:
        """The exit code of worker ``pid`` (negative: killed by that signal), None while it
        runs. A worker whose starter has ended ended with it (SIGKILL)."""
        code = self._poll_one(pid)
        if (self._orphans or self._lost_start) and pid not in self._orphans:
            self._ask_after_orphans()
        return code

    def _poll_one(self, pid: int) -> int | None:
        code = ENDED
        if not self.ended:
            try:
                code = self._ask(("poll", pid))[1]
            except (EOFError, OSError):
                pass
        if code is not None:
            self._running.discard(pid)
            self._orphans.discard(pid)
        return code

    def _ask_after_orphans(self) -> None:
        """Polls the workers of starts cut short, so that each is reaped once it has exited
        (its pipe's other end went with the start: it exits as it starts). They stayed
        zombies for good: 1,788 under rapid interrupts; one by one, not a poll inside
        another's (a poll a frame deep: a RecursionError past ~1,000, and no worker started)."""
        if self._lost_start and not self.ended:  # (a start cut short after its reply was
            try:  # read: its worker is among the starter's children; unmarked once told)
                children = self._ask(("children", None))[1]
            except (EOFError, OSError):
                children = []
            self._lost_start = False
            for pid in set(children) - self._running:
                self._running.add(pid)
                self._orphans.add(pid)
        for pid in list(self._orphans):
            self._poll_one(pid)

    def _ask(self, request: tuple, fds: Sequence[int] = ()) -> tuple:
        with self._lock:
            number = next(self._numbers)
            message = [pickle.dumps((number, *request))]
            try:
                with protocol.pipe_errors_raised():  # (a starter killed: said, not fatal)
                    socket.send_fds(self._socket, message, list(fds))
                while True:
                    data = self._socket.recv(MESSAGE_BYTES)
                    if not data:
                        raise EOFError(f"the worker starter (pid {self.pid}) has ended")
                    reply = pickle.loads(data)
                    if reply[0] == number:  # (others: replies to requests cut short)
                        return reply[1:]
                    if reply[1] == "started":  # a worker nobody knows: asked after here
                        self._running.add(reply[2])
                        self._orphans.add(reply[2])
            except (EOFError, OSError):
                self._end()
                raise

    def _end(self) -> None:
        self._ended = True
        self._socket.close()
        if launch.exit_code(self._popen) is None:  # (exiting: reaped later, not unwaited)
            _EXITING.append(self._popen)

    def close(self) -> None:
        """Closes the link: the starter exits, and workers it started exit with it."""
        self._end()

    def ended_early(self) -> JaxloaderError:
        """The error for a starter that ended before it started a worker (twice)."""
        try:
            code: Any = self._popen.wait(timeout=_ANSWER_S)
        except subprocess.TimeoutExpired:
            code = "none yet"
        return JaxloaderError(
            f"the worker starter (pid {self.pid}) ended before it started a worker (exit code "
            f"{code}): its own error is above, on this process's standard error. It runs "
            f"{sys.executable} with this process's sys.path, interpreter flags and environment "
            "(JAX_PLATFORMS=cpu, one thread a math library) and imports NumPy and jaxloader; "
            "fix what it says, or pass start_method='fork'")


_STARTERS: dict[tuple, Starter] = {}
_LOCK = threading.Lock()
_EXITING: list[subprocess.Popen] = []  # starters closed, not yet seen to exit (reaped here)


def _reap_exiting(wait_s: float = 0.0) -> None:
    """Reaps the starters closed that have exited since (``wait_s``: waiting up to that long
    for each): one dropped running warned ``ResourceWarning: subprocess ... is still
    running`` as it was collected."""
    for popen in list(_EXITING):
        try:
            popen.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        _EXITING.remove(popen)


@atexit.register
def _close_starters() -> None:
    """At exit: each starter's link closed and the starter waited for (a second at most): a
    link left to the collector warned of an unclosed socket, a process of one still running."""
    for starter in list(_STARTERS.values()):
        starter.close()
    _STARTERS.clear()
    _reap_exiting(wait_s=1.0)


def starter_for(environment: Mapping[str, str]) -> Starter:
    """The starter of workers with ``environment`` (``process.worker_environment``) and this
    process's resource limits now, started if there is none (or it has ended). Starters of
    other environments with no worker left are closed. Call it from a thread that lasts as
    long as the process (the starter dies with the thread that started it). Workers are forked
    from it, with its limits: one started before ``resource.setrlimit`` raised the descriptor
    limit gave the next loaders' workers the old one."""
    key = (sys.executable, tuple(sorted(environment.items())), _limits())
    with _LOCK:
        _reap_exiting()
        starter = _STARTERS.get(key)
        if starter is None or starter.ended:
            for other, old in list(_STARTERS.items()):
                if other != key and (old.ended or old.idle):
                    old.close()
                    del _STARTERS[other]
            starter = _STARTERS[key] = Starter(environment)
        return starter


def _limits() -> tuple:
    """This process's resource limits that a worker inherits (``resource.getrlimit``)."""
    import resource

    return tuple(resource.getrlimit(getattr(resource, name)) for name in (
        "RLIMIT_NOFILE", "RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_STACK", "RLIMIT_CORE",
        "RLIMIT_MEMLOCK") if hasattr(resource, name))


def _forget_starters() -> None:
    """In a forked child: the parent's starters answer the parent (and its lock may be held)."""
    global _LOCK
    for starter in _STARTERS.values():
        starter._socket.close()  # (the child's copy: the parent's link stays open)
    _STARTERS.clear()
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_starters)
