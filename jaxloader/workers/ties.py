"""What ties a worker to the training process: it ends with it, leaves it the terminal's and
a scheduler's signals, and runs the user's code as the training process would: with its
``sys.argv`` and with output a line at a time.

Example (in a fresh process, as a worker is: these change the process they run in):
    >>> import subprocess
    >>> from jaxloader.workers.launch import PACKAGE_ROOT
    >>> code = ("import sys; from jaxloader.workers import ties; "
    ...         "ties.take_the_trainers(['train.py', '--lr', '0.1']); print(sys.argv)")
    >>> subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
    ...                cwd=PACKAGE_ROOT).stdout.strip()
    "['train.py', '--lr', '0.1']"
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

_PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent thread ends
_WATCHDOG_S = 1.0  # elsewhere than Linux: how often a worker checks that its parent lives


def die_with_parent(parent: int, signum: int = signal.SIGKILL) -> None:
    """Makes this process end when process ``parent`` (the training process) ends, whatever
    this one is doing then: on Linux the kernel sends it ``signum``, SIGKILL unless asked
    (``PR_SET_PDEATHSIG``; asked for in the thread that started it, which ``spawner.py`` keeps
    alive as long as the main process); elsewhere a watchdog thread exits when its parent
    changes. A parent that died before this was asked for is seen at once (``getppid`` no
    longer ``parent``)."""
    watched = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            watched = libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
        except (OSError, AttributeError):
            watched = False
    if not watched:
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True,
                         name="jaxloader-parent-watchdog").start()
    if os.getppid() != parent:
        os._exit(1)


PARENT_GONE = getattr(signal, "SIGRTMIN", signal.SIGTERM) + 1  # the starter's, as it dies
# with the training process: a signal no terminal or scheduler sends


def die_with_parent_ending(parent: int, children: set[int]) -> None:
    """``die_with_parent`` for the starter: as the training process ends, the process groups of
    ``children`` (its workers, each a group of its own with what its transform runs) are
    killed, then this process exits. A worker killed by the kernel with its parent left the
    programs its transform had started (a decoder, a tokenizer server) running for good. The
    same is done where the training process closes its end (``end_groups``)."""
    def end(signum: int, frame: Any) -> None:
        end_groups(children)
        os._exit(1)

    signal.signal(PARENT_GONE, end)
    die_with_parent(parent, PARENT_GONE)


def end_groups(pids: set[int]) -> None:
    """SIGKILLs the process groups led by ``pids`` (``kill_group``)."""
    for pid in list(pids):
        kill_group(pid)


def kill_group(pid: int) -> bool:
    """SIGKILLs the process group worker ``pid`` leads (``leave_signals_to_the_trainer``: it
    and what its transform runs); False where it leads none (a sandbox that kept it in its
    parent's group: no group then has its pid)."""
    try:
        os.killpg(pid, signal.SIGKILL)
        return True
    except OSError:
        return False


def gone_before_the_trainer() -> None:
    """Raises this worker's ``oom_score_adj`` 1,000 over the training process's (at most to
    1,000): where a container's memory runs out, the kernel's out-of-memory killer ends a
    worker before the training process, which then says so (a ``WorkerError`` naming the
    signal and its step), where the training process, the largest, was ended without a word.
    A process may raise its own value without privileges (Linux alone)."""
    try:
        with open("/proc/self/oom_score_adj", encoding="ascii") as f:
            now = int(f.read().strip() or 0)
        with open("/proc/self/oom_score_adj", "w", encoding="ascii") as f:
            f.write(str(min(1000, now + 1000)))
    except (OSError, ValueError):
        pass


def leave_signals_to_the_trainer() -> None:
    """Leaves a terminal's and a scheduler's signals to the training process, which a worker
    ends with (``die_with_parent``): a worker is a process group of its own, so a terminal's
    Ctrl-C, Ctrl-\\ and Ctrl-Z reach neither it nor the programs its transform runs (they
    ended such a program in flight, and a trainer that goes on after its ``KeyboardInterrupt``
    got that batch's error); terminal I/O from that group does not stop it (SIGTTIN, SIGTTOU:
    a read there fails instead). SIGINT, SIGTERM, SIGUSR1, SIGUSR2 and SIGHUP (a scheduler's
    to every process of a job: SLURM's preemption, its `--signal=USR1@90` warning, which
    Lightning and submitit listen for) are caught by a handler that does nothing: a trainer
    that saves on one found its workers gone before its save. They are caught, not ignored:
    an ignored signal stays ignored in every program a transform runs (``terminate()`` and
    ``send_signal(SIGINT)`` did nothing there); a caught one is reset by exec. A system call
    the signal lands in is restarted (``siginterrupt``), as under an ignored one: a C library
    a transform calls need not retry one that fails with EINTR."""
    try:
        os.setpgid(0, 0)
    except OSError:  # (a sandbox that forbids it: the handlers below still hold)
        pass
    for signum in (signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(signum, signal.SIG_IGN)
    for signum in _HELD:
        signal.signal(signum, _left_to_the_trainer)
        signal.siginterrupt(signum, False)
    _worker[0] = os.getpid()


_worker = [0]  # the worker's pid: a process it forks has another


def _left_to_the_trainer(signum: int, frame: Any) -> None:
    """A worker's handler of ``_HELD``: nothing to do (``leave_signals_to_the_trainer``).
    In a process the worker forked, where the signal came before ``_signals_back`` ran (a
    ``multiprocessing.Pool`` ended as one of its children still started: ``terminate()``
    then waited for it forever), the signal does what Python's own handler would."""
    if os.getpid() == _worker[0]:
        return
    _signals_back()
    if signum == signal.SIGINT:
        signal.default_int_handler(signum, frame)
    os.kill(os.getpid(), signum)


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(_WATCHDOG_S)
        if os.getppid() != parent:
            os._exit(1)


def take_the_trainers(argv: list[str]) -> None:
    """Runs what follows (the payload's imports, ``worker_init_fn``, transforms) as in the
    training process: its ``sys.argv`` (a module that parses the command line as it is
    imported got its defaults, silently: the worker's own is ``["-c"]``); standard output
    written a line at a time, as to a terminal (a busy worker is killed at ``close()`` and
    after a failing step, and a file's or a pipe's block of buffered ``print`` output went
    with it). (A process the user's code forks, a ``multiprocessing.Pool``'s, gets Python's
    own handlers of the signals held here from ``hold_signals_across_forks``.)"""
    sys.argv[:] = argv
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(line_buffering=True, write_through=False)  # (python -u's: each
                # piece of a print one write, two workers' lines cut into each other)
            except (OSError, ValueError):  # (closed, or not a text stream of io's)
                pass


def hold_signals_across_forks() -> None:
    """A process the worker forks gets Python's own handlers of ``_HELD``
    (``_signals_back``); called after the worker's other fork hooks are registered, so that
    its own runs last: a SIGINT let through before another hook's Python code (the log
    relay's) was raised there, printed and dropped."""
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_hold_signals, after_in_parent=_release_signals,
                            after_in_child=_signals_back_in_child)


_HELD = {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP}
_MASKS: dict[int, Any] = {}  # a forking thread's signal mask before its fork, by thread


def _hold_signals() -> None:
    """Before the worker forks: SIGINT and SIGTERM held (blocked) in the forking thread, so a
    child gets one sent before ``_signals_back`` reset its handlers once they are reset (one
    that came between the fork and the reset tripped the worker's handler, which the reset
    then dropped: a ``Pool``'s ``terminate()`` waited for that child forever, CI on 3.11)."""
    _MASKS[threading.get_ident()] = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)


def _release_signals() -> None:
    """The forking thread's mask as it was before the fork (a transform's own blocked
    signals stay blocked, in the worker and in its child)."""
    mask = _MASKS.pop(threading.get_ident(), None)
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _signals_back() -> None:
    """In a child the worker forks: SIGINT and SIGTERM as Python starts with them where they
    still have the worker's handler, which does nothing (``Pool.terminate()``, a ``with
    Pool()`` block's end, waited forever for children it could not end; a handler the user's
    code set is its own), then let through (held since the fork: ``_hold_signals``). SIGINT
    is let through under the system's default: one held since the fork ends the child, as an
    uncaught ``KeyboardInterrupt`` would (raised here, in a fork hook, Python drops it)."""
    reset = [signum for signum in _HELD if signal.getsignal(signum) is _left_to_the_trainer]
    try:
        for signum in reset:
            signal.signal(signum, signal.SIG_DFL)
    except ValueError:  # (not the main thread: CPython makes the forking thread it)
        reset = []
    mask = _MASKS.get(threading.get_ident())
    _MASKS.clear()  # (other threads' forks, in the parent, are not this process's)
    if mask is None:  # (the thread's id not kept across the fork: unheld, not left held)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)
    else:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if signal.SIGINT in reset:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _signals_back_in_child() -> None:
    """``_signals_back`` as a fork hook: a SIGINT that comes as it runs (sent just after the
    fork: let through as the mask comes back, or as Python's handler does) raises
    ``KeyboardInterrupt`` in the hook, where Python drops it with a traceback and the child
    lives on; it ends the child instead, as one held since the fork does."""
    try:
        _signals_back()
    except KeyboardInterrupt:
        try:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            os.kill(os.getpid(), signal.SIGINT)
        finally:  # (where it cannot be made the default: not the main thread)
            os._exit(128 + signal.SIGINT)
