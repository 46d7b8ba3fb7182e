"""Starting and stopping one worker process.

Start methods:

- ``"exec"`` (default, every platform with POSIX shared memory): a fresh interpreter that
  imports only ``jaxloader.workers.worker``. It never re-runs the user's main script (so a
  top-level ``jax.distributed.initialize()`` runs once) and is never a fork of a process in
  which JAX has started threads. On Linux it is a fork of the worker starter, one such
  interpreter kept by the training process (``jaxloader.workers.starter``): a few
  milliseconds a worker, the interpreter's start and imports paid once. Elsewhere each worker
  is started by ``subprocess`` and pays them (0.3-0.5 s of CPU; in parallel for all workers).
- ``"fork"`` (POSIX): ``os.fork()`` of the main process; shares its memory copy-on-write
  (and starts faster where there is no starter), but is refused once JAX has been imported,
  because forking a process with JAX's threads running can deadlock the child.

Either way the worker's link is one duplex pipe; its EOF tells each side the other is gone.
A worker also ends with the main process whatever it is doing (``ties.die_with_parent``: on
Linux the kernel's parent-death signal, which fires when the *thread* that started the worker
ends; so a worker is started from the main thread, or from a thread kept as long as the process,
``spawner.in_lasting_thread``, never from a short-lived one such as a device-put thread).

Stopping is quick whatever the worker is doing: it is told to stop, and one that has not closed
its pipe after ``STOP_GRACE_S`` (busy in a transform, with tasks queued behind the message) is
killed: nothing it holds needs it to exit cleanly (its memory files and locks go with it). One
that has is waited for as it ends (its threads, its atexit hooks: ``worker.leave``): up to
``LEAVE_S``, then killed with a warning, however it was started.

A worker's JAX, should a transform use it, runs on the CPU (``JAX_PLATFORMS=cpu``): the
accelerators belong to the training process. A worker that started a GPU backend would take
75% of the GPU's memory (JAX's preallocation) for itself, and a TPU is held by one process.
``worker_init_fn`` may set ``jax.config.update("jax_platforms", ...)`` before JAX first runs.

Math libraries in a worker use one thread (``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``,
``OMP_NUM_THREADS`` of 1; XLA's for a ``JitMap``, ``JAXLOADER_XLA_THREADS`` of 1), as PyTorch's
``DataLoader`` does with its own: the workers are the
parallelism. NumPy's OpenBLAS otherwise starts a thread a core in every worker, each spinning
for a while at its start (later first batches, more of the workers' CPU), and a transform's matrix product in N workers
would run N x cores threads. A value the training process's environment sets is kept.

A worker's copies of ``NON_TEMPORAL_BYTES`` (1 MiB) or more bypass its caches (non-temporal
stores: glibc's ``x86_non_temporal_threshold``, through ``GLIBC_TUNABLES``; x86-64 Linux with
glibc 2.29 or newer, workers started by ``"exec"``). A slot is written once by a worker and read
by another process: a copy into it through the caches can read the slot's lines from memory
before writing them (read-for-ownership) and evicts what the worker works on (a ``JitMap``'s
chunk, its input). glibc's own threshold depends on its version and the machine: 3/4 of a
thread's share of the last-level cache up to glibc 2.37 (near 1 MiB on a many-core server,
tens of MiB on a small VM that reports a large cache), about a quarter of that cache from
2.38. Every copy of that size in a worker is affected (a transform's own, a decoder's, XLA's),
and processes a worker starts inherit the variable. A ``GLIBC_TUNABLES`` of the training
process's environment is kept, with the threshold added unless it names one.
"""

from __future__ import annotations

import atexit
import logging
import os
import platform
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Pipe, wait
from typing import Any, Mapping

from jaxloader.base.errors import ConfigError
from jaxloader.batching.jit_cpu import jax_settings
from jaxloader.workers import launch, protocol, starter
from jaxloader.workers.ties import kill_group
from jaxloader.workers.protocol import Stop
from jaxloader.workers.spawner import in_lasting_thread

log = logging.getLogger("jaxloader")

STOP_GRACE_S = 0.25  # an idle worker told to stop exits within it; a busy one is then killed
_POLL_S = 0.005  # between two asks of a worker's exit code (its starter reaps it)
LEAVE_S = 5.0  # a worker's end after it closed its pipe (its threads, atexit hooks): then killed
_KILL_TIMEOUT_S = 2.0  # after SIGKILL the kernel reaps quickly; bound it so close() never hangs
# JAX in a worker runs on the CPU; the default backend's name (deprecated) goes with it, as a
# GPU's name there would name a backend the worker does not start
WORKER_ENVIRONMENT = {"JAX_PLATFORMS": "cpu"}
_DROPPED = ("JAX_PLATFORM_NAME",)
# One thread a math library in a worker, unless the environment says otherwise (module docstring)
THREAD_DEFAULTS = {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                   "NUMBA_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1",  # (tokenizers' pool)
                   "OPENCV_FOR_THREADS_NUM": "1",
                   "JAXLOADER_XLA_THREADS": "1"}  # (a JitMap's XLA: batching/jit_cpu.py)
# Copies this large or larger bypass a worker's caches (module docstring); glibc reads the
# threshold when the process starts, so a forked worker keeps its parent's
NON_TEMPORAL = "glibc.cpu.x86_non_temporal_threshold"
NON_TEMPORAL_BYTES = 1 << 20
_X86_LINUX = sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")
_BOOT = "__jaxloader_boot__ = 1; from jaxloader.workers.worker import run; run({fd}, {parent})"


def worker_environment(parent: Mapping[str, str]) -> dict[str, str]:
    """The environment of a worker started from one with ``parent``'s.

    Example:
        >>> env = worker_environment({"JAX_PLATFORMS": "cuda", "OMP_NUM_THREADS": "4"})
        >>> env["JAX_PLATFORMS"], env["OMP_NUM_THREADS"], env["OPENBLAS_NUM_THREADS"]
        ('cpu', '4', '1')
    """
    kept = {name: value for name, value in parent.items() if name not in _DROPPED}
    environment = {**THREAD_DEFAULTS, **kept, **jax_environment(kept), **WORKER_ENVIRONMENT}
    tunables = environment.get("GLIBC_TUNABLES", "")
    if _X86_LINUX and NON_TEMPORAL not in tunables:
        environment["GLIBC_TUNABLES"] = ":".join(
            filter(None, (tunables, f"{NON_TEMPORAL}={NON_TEMPORAL_BYTES}")))
    return environment


def jax_environment(parent: Mapping[str, str]) -> dict[str, str]:
    """``JAX_ENABLE_X64`` as this process has 64-bit JAX (``jax.config.update``), where it has
    imported JAX: a ``Map`` computing with ``jax.numpy`` in a worker made int32 and float32
    (values past 2**31 wrapped) where this process made int64, without a word; "0" only where
    the environment says otherwise (a ``JitMap`` is told its own). And ``jit_cpu.CARRIED``
    as this process has them, which a worker's JAX reads as it is imported: a ``Map`` making
    keys with ``jax.random.key`` drew threefry's bits in a worker, rbg's here."""
    jax = sys.modules.get("jax")
    try:
        on = jax is not None and bool(jax.config.read("jax_enable_x64"))
    except Exception:  # (a JAX being imported, or without the option: as its environment)
        return {}
    carried = {name.upper(): str(int(value)) if isinstance(value, bool) else str(value)
               for name, value in (jax_settings() or {}).items()
               if value is not None and name != "jax_enable_x64"}  # (below: as the parent's)
    if on:
        return {**carried, "JAX_ENABLE_X64": "1"}
    said = parent.get("JAX_ENABLE_X64", "").strip().lower()
    return {**carried, **({"JAX_ENABLE_X64": "0"} if jax is not None and said not in (
        "", "0", "false") else {})}


class WorkerProcess:
    """A started worker: ``conn`` to talk to it, ``pid``, ``exitcode()``, ``let_go()`` then
    ``reap()`` to stop it."""

    def __init__(self, start_method: str, into: list | None = None,
                 environment: dict[str, str] | None = None) -> None:
        """``into``: the caller's list, which the worker joins as soon as it has started (a
        Ctrl-C as this returns leaves none the caller cannot stop: ``base.interrupts``, 3).
        ``environment``: the worker's (``worker_environment``), by default this thread's."""
        if start_method == "fork" and "jax" in sys.modules:
            raise ConfigError(
                "start_method='fork': JAX is imported in this process, and forking a process "
                "whose JAX runtime may have started threads can deadlock the workers; use "
                "start_method='exec' (the default)"
            )
        self.conn, child = Pipe(duplex=True)
        self._popen: subprocess.Popen | None = None
        self._starter: starter.Starter | None = None
        self._fork_pid: int | None = None
        self._exitcode: int | None = None
        self._asked = False
        self.sentinel: int | None = None
        if environment is None:  # (in this thread: jax.enable_x64 as a context holds here)
            environment = worker_environment(os.environ)
        try:
            in_lasting_thread(lambda: self._start(start_method, child, environment))
        finally:  # (joined first: a Ctrl-C in close() lost a forked worker's pid, a zombie)
            if into is not None and getattr(self, "pid", None) is not None:
                into.append(self)
            child.close()
        self.sentinel = _sentinel(self.pid)

    def _start(self, start_method: str, child: Any, environment: dict[str, str]) -> None:
        parent = os.getpid()
        if start_method == "exec" and starter.AVAILABLE:
            self._starter = starter.starter_for(environment)
            try:
                self.pid = self._starter.start(child.fileno(), _cwd())
            except (EOFError, OSError):  # (it ended since: killed, or out of memory)
                self._starter = starter.starter_for(environment)
                try:
                    self.pid = self._starter.start(child.fileno(), _cwd())
                except (EOFError, ConnectionError) as e:  # (it ended as it started: a bare
                    raise self._starter.ended_early() from e  # "Connection reset by peer")
            return
        if start_method == "exec":
            fd = child.fileno()
            self._popen = launch.launch(_BOOT.format(fd=fd, parent=parent), pass_fds=(fd,),
                                        env=environment)
            self.pid = self._popen.pid
            return
        self.pid = self._fork_pid = os.fork()
        if self._fork_pid == 0:  # the child: serve, then leave as an exec'd worker does,
            code = 0  # running its own atexit hooks alone (the trainer's are dropped)
            try:
                atexit._clear()
                self.conn.close()
                # the same environment as an exec'd worker's (the thread defaults reach
                # libraries loaded from here on: NumPy's already has its threads)
                for name in _DROPPED:
                    os.environ.pop(name, None)
                os.environ.update(environment)
                from jaxloader.workers.worker import leave, main

                main(child.fileno(), parent)
                leave()
            except BaseException:  # noqa: BLE001
                code = 1
            finally:
                os._exit(code)

    def exitcode(self, timeout: float | None = 0.0) -> int | None:
        """The exit code (negative: killed by that signal), or None if still running after
        ``timeout`` seconds. Call it once the pipe has reported EOF: the worker is then exiting."""
        if self._exitcode is None:
            if self._starter is not None:
                self._exitcode = self._starter_exitcode(timeout)
            elif self._popen is not None:
                self._exitcode = launch.exit_code(self._popen, timeout)
            elif self._fork_pid is not None:
                self._exitcode = self._fork_exitcode(timeout)
            if self._exitcode is not None:  # reaped, asked or not: what its transform ran
                _end_group(self.pid)  # goes too (it ran on for good; a program kept)
        return self._exitcode

    def _fork_exitcode(self, timeout: float | None) -> int | None:
        """A forked worker's exit code, waited for up to ``timeout`` (after its pipe's EOF, it
        may not have been reaped yet: one look would lose how it ended)."""
        assert self._fork_pid is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                pid, status = os.waitpid(self._fork_pid, 0 if timeout is None else os.WNOHANG)
            except ChildProcessError:  # (reaped by another: SIGCHLD ignored, a handler's)
                return launch.EXIT_UNKNOWN
            if pid:
                return os.waitstatus_to_exitcode(status)
            if deadline is None or time.monotonic() >= deadline:
                return None
            time.sleep(_POLL_S)

    def _starter_exitcode(self, timeout: float | None) -> int | None:
        assert self._starter is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self._starter.poll(self.pid)
            if code is not None or (deadline is not None and time.monotonic() >= deadline):
                return code
            time.sleep(_POLL_S)

    def starter_ended(self) -> tuple[int, int | None] | None:
        """The pid and exit code of this worker's starter where that process has exited (the
        worker then ended with it); ``None`` otherwise."""
        starter = self._starter
        if starter is None or not starter.ended:
            return None
        code = starter.exit_code()
        return None if code is None else (starter.pid, code)

    def ask_to_stop(self) -> None:
        """Sends the stop message without waiting (so several workers wind down together)."""
        if not self._asked and self._exitcode is None:
            self._asked = True
            try:
                protocol.send(self.conn, Stop())
            except (OSError, ValueError):
                pass  # already gone or already closed

    def kill(self) -> None:
        """SIGKILL, unless it is known to have exited (its pid may then be another process's).
        Only a signal: safe from a thread other than the one talking to the worker."""
        if self._exitcode is None and not kill_group(self.pid):  # (no group of its own)
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def let_go(self, deadline: float | None = None) -> None:
        """Asks the worker to stop, waits for its pipe to close until ``deadline``
        (``time.monotonic()``; by default ``STOP_GRACE_S`` from now), kills it if it does not
        (or if the wait is interrupted); idempotent. Messages still in the pipe are dropped.
        ``reap()`` then waits for the end of a worker that let go in time (its threads, its
        atexit hooks: ``worker.leave``), so several workers are let go within one grace before
        any is waited for: one worker's end must not use up another's grace."""
        if self._exitcode is not None:  # (its end known: its pipe and pidfd still open)
            self.conn.close()
            self._close_sentinel()
            return
        self.ask_to_stop()
        if deadline is None:
            deadline = time.monotonic() + STOP_GRACE_S
        drained = False
        try:
            drained = self._wait_for_eof(deadline - time.monotonic())
        finally:
            if not drained:
                self.kill()
            self.conn.close()
            self._close_sentinel()

    def _close_sentinel(self) -> None:
        """Closes the pidfd (idempotent: ``let_go`` and ``reap`` both ask)."""
        sentinel, self.sentinel = self.sentinel, None
        if sentinel is not None:
            os.close(sentinel)

    def reap(self, deadline: float | None = None) -> int | None:
        """The exit code once the worker has ended (``let_go()`` first), waited for until
        ``deadline`` (by default ``LEAVE_S`` from now: its threads, atexit hooks), then killed,
        said: a thread that never ends kept it alive, and ``close()`` waited for a forked one
        for good, left an exec'd one running. None if it still runs after that."""
        self._close_sentinel()
        if (code := self.exitcode(timeout=LEAVE_S if deadline is None else max(
                0.0, deadline - time.monotonic()))) is None:
            log.warning("worker process %s still ran %.0f s after it was asked to stop and "
                        "closed its pipe (a thread of its own that never ends, a non-daemon one "
                        "its worker_init_fn or a transform started, or an atexit hook that "
                        "waits): killed; make such a thread daemon=True", self.pid, LEAVE_S)
            self.kill()
            code = self.exitcode(timeout=_KILL_TIMEOUT_S)
        return code

    def _wait_for_eof(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.conn.closed:
            left = deadline - time.monotonic()
            if left <= 0 or not wait([self.conn], left):
                return False
            try:
                self.conn.recv_bytes()  # dropped unread
            except (EOFError, OSError):
                return True
        return True


def _end_group(pid: int) -> None:
    """Kills the process group of reaped worker ``pid`` (what its transform runs), where no
    process has its pid: a group's id is not given to a new process while any of its members
    lives, so with none it is that group's; a process of that pid is another's (reaped long
    before: its starter gone, or SIGCHLD ignored)."""
    try:
        os.kill(pid, 0)
        return
    except ProcessLookupError:
        kill_group(pid)
    except PermissionError:
        pass


def _sentinel(pid: int) -> int | None:
    """A descriptor readable once process ``pid`` has ended (Linux's pidfd; ``None`` elsewhere,
    or where the kernel has none): a worker's death is seen through it even where its pipe
    reports no EOF, a copy of the pipe's worker end held by another process (forked by
    another thread while the worker started, or a forked worker of another loader)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # (not Linux, a kernel before 5.3, or ended already:
        return None  # its pipe says so)


def _cwd() -> str | None:
    """This process's current directory; None if it has been removed."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        return None
