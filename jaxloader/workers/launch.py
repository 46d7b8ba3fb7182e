"""How a fresh interpreter for workers is launched (the starter, or an exec'd worker): its
command line, directory and path, and the training process's standard descriptors.

It runs what the training process runs: the same executable, the same interpreter flags
(``-O``, ``-W error``, ``-X dev``: a transform's ``assert`` or a warning made an error acts
the same with 0 or N workers, as ``multiprocessing``'s children do), and the training
process's ``sys.path`` from its first lines, before it imports NumPy or jaxloader (a relative
``PYTHONPATH`` entry, or a script that added a folder under ``-S``, would not be found from
another directory). The path goes through a pipe: an argument holds 128 KiB at most, and a
long ``sys.path`` (a Bazel or Nix tree) is longer. Its descriptors 0, 1 and 2 are open
(``/dev/null`` where the training process had them closed, or close-on-exec), and
``sys.stdout`` and ``sys.stderr`` with them: numbers the descriptors it is handed would
otherwise take (a worker's standard output put over its pipe), and a worker's prints lost.

Example:
    >>> popen = launch("print(sys.path[0] == PACKAGE)".replace("PACKAGE", repr(PACKAGE_ROOT)),
    ...                stdout=subprocess.PIPE, text=True)
    >>> popen.communicate()[0]
    'True\\n'
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

# the folder jaxloader is imported from, put first on a fresh interpreter's path
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PRELUDE = """import json, os, signal, sys
for stopping in (signal.SIGTTIN, signal.SIGTTOU):
    signal.signal(stopping, signal.SIG_IGN)
for f in (0, 1, 2):
    try:
        os.fstat(f)
    except OSError:
        os.open(os.devnull, os.O_RDWR)
for f, name in ((1, "stdout"), (2, "stderr")):
    if getattr(sys, name) is None:
        setattr(sys, name, open(f, "w", closefd=False, errors="backslashreplace"))
with open({fd}, "rb") as f:
    sys.path[:] = json.loads(f.read())
del stopping, f, name
"""


def launch(code: str, pass_fds: tuple[int, ...] = (), **popen: Any) -> subprocess.Popen:
    """A fresh interpreter that runs ``code`` (Python, after the prelude that makes it what
    this process is: module docstring), started in this process's directory where that
    exists (Python 3.13.0 cannot import NumPy in a removed one: ``/`` then), and in a process
    group of its own from its first instruction: a terminal's or a notebook's Ctrl-C (sent to
    the training process's group) reached it while it imported, before a worker leaves the
    signals to the trainer, and printed its ``KeyboardInterrupt``. As a background group's,
    its writes to the terminal under ``stty tostop`` (and its reads) do not stop it: the
    prelude ignores SIGTTOU and SIGTTIN, as a worker does."""
    path = [PACKAGE_ROOT] + [os.path.abspath(p) if p else "" for p in map(_path, sys.path) if
                             p is not None]
    flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
    read_end, write_end = os.pipe()
    try:
        started = _popen([sys.executable, *flags, "-c", _PRELUDE.format(fd=read_end) + code],
                         pass_fds=(*pass_fds, read_end), cwd=_directory(), **popen)
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    try:
        with open(write_end, "wb") as sending:  # (a long path: written as the child reads)
            sending.write(json.dumps(path).encode())
    except BrokenPipeError:
        pass  # (it ended as it started: said where its exit is asked after)
    return started


def _popen(args: list[str], **popen: Any) -> subprocess.Popen:
    """``args`` started in a process group of its own, or in this one where a sandbox forbids
    ``setpgid`` (a worker then asks for one again, and leaves SIGINT to the trainer when it
    is not allowed)."""
    try:
        return subprocess.Popen(args, **{"process_group": 0, **popen})
    except PermissionError:
        return subprocess.Popen(args, **popen)


def _path(entry: Any) -> str | None:
    """A ``sys.path`` entry as a path, or ``None`` (the importer skips what is not one)."""
    try:
        return os.fsdecode(entry)
    except TypeError:
        return None


def is_open(fd: int) -> bool:
    """Whether ``fd`` is an open descriptor of this process."""
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _directory() -> str | None:
    try:
        os.getcwd()
    except FileNotFoundError:
        return "/"
    return None


def hold_standard_descriptors() -> None:
    """Opens ``/dev/null`` on each of descriptors 0, 1 and 2 that is closed (a script run as
    ``python train.py >&-``, a daemon's): the loader's own pipes and memory files took those
    numbers, and were handed to workers as their standard output, which overwrote a worker's
    pipe (it never started: a bare ``BrokenPipeError``)."""
    for fd in (0, 1, 2):
        if not is_open(fd):
            opened = os.open(os.devnull, os.O_RDWR)
            if opened != fd:  # (a lower one was closed meanwhile: taken by another thread)
                os.close(opened)
            else:  # (as a standard descriptor is: a child's, where exec leaves it)
                os.set_inheritable(fd, True)


EXIT_UNKNOWN = 1 << 16
"""An exit code no process has: one this process could not learn, its child reaped by another
waiter (SIGCHLD ignored, or a handler of the script's calling ``waitpid``), where
``subprocess`` says 0."""


def exit_code(popen: subprocess.Popen, timeout: float | None = 0.0) -> int | None:
    """``popen``'s exit code (negative: killed by that signal; ``EXIT_UNKNOWN``), waited for
    up to ``timeout`` seconds (``None``: until it exits); ``None`` while it runs."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while popen.returncode is None:
        try:
            pid, status = os.waitpid(popen.pid, 0 if timeout is None else os.WNOHANG)
        except ChildProcessError:  # (reaped by another)
            popen.returncode = EXIT_UNKNOWN
            break
        if pid:
            popen.returncode = os.waitstatus_to_exitcode(status)
        elif deadline is None or time.monotonic() >= deadline:
            return None
        else:
            time.sleep(0.005)
    return popen.returncode
