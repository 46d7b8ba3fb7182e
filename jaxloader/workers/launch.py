"""How a fresh interpreter for workers is launched (the starter, or an exec'd worker): its
command line and directory, and the training process's standard descriptors it inherits.

It runs what the training process runs: the same executable, the same interpreter flags
(``-O``, ``-W error``, ``-X dev``: a transform's ``assert`` or a warning made an error acts
the same with 0 or N workers, as ``multiprocessing``'s children do), and the training
process's ``sys.path`` from its first line, before it imports NumPy or jaxloader (a relative
``PYTHONPATH`` entry, or a script that added a folder under ``-S``, would not be found from
another directory). Its descriptors 0, 1 and 2 are open (``/dev/null`` where the training
process had them closed, or close-on-exec): numbers the descriptors it is handed would
otherwise take, and a worker's standard output put over its pipe.

Example:
    >>> command = boot_command("from jaxloader.workers.starter import serve; serve(5, 1)")
    >>> command[-2], "sys.path[:] = " in command[-1]
    ('-c', True)
"""

from __future__ import annotations

import os
import subprocess
import sys

# the folder jaxloader is imported from, put first on a fresh interpreter's path
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PRELUDE = (
    "import os, sys\n"
    "for f in (0, 1, 2):\n"
    "    try:\n"
    "        os.fstat(f)\n"
    "    except OSError:\n"
    "        os.open(os.devnull, os.O_RDWR)\n"
    "sys.path[:] = {path!r}\n"
)


def boot_command(code: str) -> list[str]:
    """The command line of a fresh interpreter that runs ``code`` (a line of Python) as this
    process would (module docstring)."""
    path = [PACKAGE_ROOT] + [os.path.abspath(p) if p else p for p in sys.path]
    flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
    return [sys.executable, *flags, "-c", _PRELUDE.format(path=path) + code]


def boot_directory() -> str | None:
    """The directory to start it in: this process's (``None``), or ``/`` where that one has
    been removed (Python 3.13.0 cannot import NumPy in a removed directory)."""
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
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)
            if opened != fd:  # (a lower one was closed meanwhile: taken by another thread)
                os.close(opened)
            else:  # (as a standard descriptor is: a child's, where exec leaves it)
                os.set_inheritable(fd, True)
