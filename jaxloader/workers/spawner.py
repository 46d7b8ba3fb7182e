"""The thread that starts workers where the caller's thread may end before the process does.

The kernel's parent-death signal (``prctl(PR_SET_PDEATHSIG)``, which a worker sets to end with
the training process) fires when the thread that started it ends, not the process: a worker
started from a device-put thread, or a user's short-lived one, would be killed with that
thread. ``in_lasting_thread`` starts it from the main thread, or from one daemon thread kept
for the process's life.

Example:
    >>> started = []
    >>> in_lasting_thread(lambda: started.append(threading.current_thread().name))
    >>> started == [threading.main_thread().name]
    True
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Callable

_SPAWNS: queue.SimpleQueue = queue.SimpleQueue()
_SPAWNER: list[threading.Thread] = []
_SPAWNER_LOCK = threading.Lock()


def _forget_spawner() -> None:
    """In a forked child: the thread is not there (only the forking thread is), nor may its
    lock and queue be in a state the child can use."""
    global _SPAWNS, _SPAWNER_LOCK
    _SPAWNS, _SPAWNER_LOCK = queue.SimpleQueue(), threading.Lock()
    _SPAWNER.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_spawner)


def in_lasting_thread(start: Callable[[], None]) -> None:
    """Runs ``start`` (which starts a process) in a thread that lives as long as this process:
    the main thread if that is the caller, else a daemon thread kept for it. The kernel's
    parent-death signal fires when the starting thread ends (prctl(2)); a worker started from a
    device-put thread, or a user's short-lived one, would be killed with that thread."""
    if threading.current_thread() is threading.main_thread():
        start()
        return
    with _SPAWNER_LOCK:
        if not _SPAWNER:
            _SPAWNER.append(threading.Thread(target=_spawn_forever, daemon=True,
                                             name="process-starter (for jaxloader)"))
            _SPAWNER[0].start()
    done: queue.SimpleQueue = queue.SimpleQueue()
    _SPAWNS.put((start, done))
    error = done.get()
    if error is not None:
        raise error


def _spawn_forever() -> None:
    while True:
        start, done = _SPAWNS.get()
        try:
            start()
        except BaseException as e:  # noqa: BLE001 - raised in the thread that asked
            done.put(e)
        else:
            done.put(None)
