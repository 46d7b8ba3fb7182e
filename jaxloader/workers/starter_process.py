"""The starter process's side of ``starter``: it imports what every worker imports, then
forks a worker for each request of the training process, reaps them, and ends with the
training process, their process groups with it (``ties.die_with_parent_ending``).

Example (a worker's exit code, once reaped, kept for the pool's later asks):
    >>> _reaped(os.getpid(), {os.getpid(): 0})
    0
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
from typing import Any, NoReturn

MESSAGE_BYTES = 1 << 16  # a request or a reply is a small tuple
ENDED = -signal.SIGKILL  # a worker whose starter ended: killed with it (die_with_parent)


def serve(fd: int, parent: int) -> None:
    """The starter's main: imports what every worker imports, then answers requests until the
    training process (``parent``) closes its end. A worker forked from it does not return
    from it: it ends as an exec'd worker does (``worker.run``)."""
    import importlib

    from jaxloader.workers import ties

    importlib.import_module("numpy.random")  # (a RandomMap's generators: imported once for all)
    ties.die_with_parent_ending(parent, _CHILDREN)
    ties.leave_signals_to_the_trainer()
    # (its workers its own to reap: a trainer's SIGCHLD ignored lost their exit codes)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    with socket.socket(fileno=fd) as link:
        _answer(link, _CHILDREN)
    ties.end_groups(_CHILDREN)


_CHILDREN: set[int] = set()  # forked, not reaped: asked after, and ended with the trainer


def _answer(link: socket.socket, children: set[int]) -> None:
    """The starter's requests, answered until the link closes."""
    exited: dict[int, int] = {}
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(link, MESSAGE_BYTES, 3)
        except OSError:
            return
        if not data:
            return
        number, kind, argument = pickle.loads(data)
        reply: tuple[Any, ...]
        if kind == "start":
            (cwd, std), me, pid = argument, os.getpid(), _fork(fds)
            if pid == 0:  # the worker
                link.close()
                _become_worker(fds, cwd, std, me)
            if isinstance(pid, int):
                exited.pop(pid, None)  # (a pid of a worker reaped before, now this one's)
                children.add(pid)
                reply = ("started", pid)
            else:
                reply = ("failed", pid)
        elif kind == "children":
            reply = ("children", sorted(children))
        else:
            reply = ("exit", _reaped(argument, exited))
            if reply[1] is not None:
                children.discard(argument)
        try:
            link.sendmsg([pickle.dumps((number, *reply))])
        except OSError:  # (the training process closed its end as it exits: no traceback)
            return


def _fork(fds: list[int]) -> int | str:
    """``os.fork()``; in the starter, the descriptors received closed (its child keeps them);
    what went wrong, said, if the fork failed."""
    try:
        pid: int | str = os.fork()
    except OSError as e:
        pid = f"fork() raised {type(e).__name__}: {e}"
    if pid:
        for fd in fds:
            os.close(fd)
    return pid


def _become_worker(fds: list[int], cwd: str | None, std: list[int], parent: int) -> NoReturn:
    """In a forked child: the training process's standard output and error and directory of
    the moment (a directory gone or closed to it: the starter's, as an exec'd worker would be
    left in one that is gone), then the worker's life (``worker.run``, which gives NumPy's
    global generator a state of its own)."""
    from jaxloader.workers import ties

    signal.signal(ties.PARENT_GONE, signal.SIG_DFL)  # (the starter's, as are its children)
    _CHILDREN.clear()
    for target, fd in zip(std, fds[1:]):
        os.dup2(fd, target)
        os.close(fd)
    if cwd is not None:
        try:
            os.chdir(cwd)
        except OSError:
            pass
    from jaxloader.workers.worker import run

    run(fds[0], parent)


def _reaped(pid: int, exited: dict[int, int]) -> int | None:
    """Worker ``pid``'s exit code if it has exited (reaped then), else None."""
    if pid not in exited:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return ENDED  # (not one of this starter's: nothing to wait for)
        if not done:
            return None
        exited[pid] = os.waitstatus_to_exitcode(status)
    return exited[pid]
