"""Where the shared blocks' tables live (``shared_blocks``): many sources' tables in one file.

::

    main process:  lease(count) ──> a range of slots of a table file with room (a new file
                   when none has; one of its own for a table larger than one holds); its name:
                   "<file>@<first slot>"
                   Lease.destroy(): the file goes with the last lease of it
    a worker:      opened(file) ──> the file's one descriptor and mapping in this process,
                   shared by every source with a range in it; let_go(file) closes them with the
                   last user

A file a table held a descriptor in the main process and one in every worker for each
``ParquetSource`` that crossed to them: a mixture of hundreds of one-file sources ran out of
descriptors at the common limit of 1,024. A range is never given twice in one file, so a slot
names only its own source's blocks; a process holds one descriptor of a file (and its mapping
one more before Python 3.13), closed only with the file's last table in the process (closing
any descriptor of a file drops this process's record locks on it).

Example:
    >>> first, second = lease(3), lease(5)
    >>> first.name.split("@")[0] == second.name.split("@")[0], second.name.split("@")[1]
    (True, '3')
    >>> first.destroy(), second.destroy()
    (True, True)
"""

from __future__ import annotations

import collections
import mmap
import os
import threading
from typing import Any

from jaxloader.runtime import shm

SLOT_BYTES = 32  # a slot: four int64s (shared_blocks)
_SLOTS = 1 << 15  # slots a table file holds (1 MiB); a larger table gets a file of its own
_LOCK = threading.Lock()  # (sources may cross to workers from several threads at once)
_FILES: list["_File"] = []  # the main process's table files with a lease
# Leases let go and not yet counted: a source's finalizer lets its lease go, and a collection
# may run it inside ``lease`` (an allocation there), in the thread that holds the lock
_RELEASED: collections.deque["_File"] = collections.deque()
_OPENED: dict[str, list[Any]] = {}  # a file's name -> [descriptor, mapping, users], here


class _File:
    def __init__(self, slots: int) -> None:
        self.segment = shm.Segment.create(slots * SLOT_BYTES, memfd=True)
        self.slots, self.used, self.leases = slots, 0, 0


class Lease:
    """A table's range of a table file (main process): ``name`` crosses to the workers."""

    def __init__(self, file: _File, base: int) -> None:
        self._file: _File | None = file
        self.name = f"{file.segment.name}@{base}"

    def destroy(self) -> bool:
        """Lets the range go (idempotent); the file goes with its last lease. Whether it was
        held. Never waits: where the lock is held, its holder counts it (``_settle``)."""
        file, self._file = self._file, None
        if file is None:
            return False
        _RELEASED.append(file)
        _settle()
        return True


def lease(count: int) -> Lease:
    """A table of ``count`` slots (main process), in a file with room for it, else a new one;
    raises ``SharedMemoryError`` or ``OSError`` where no file can be made."""
    count = max(count, 1)
    try:
        with _LOCK:
            file = next((f for f in _FILES if f.used + count <= f.slots), None)
            if file is None:
                file = _File(max(count, _SLOTS))
                _FILES.append(file)
            base, file.used, file.leases = file.used, file.used + count, file.leases + 1
    finally:
        _settle()  # (leases a collection let go meanwhile)
    return Lease(file, base)


def _settle() -> None:
    """Counts the leases let go, destroying the files left with none; where the lock is held
    (by another thread, or by this one: a finalizer run inside ``lease``), its holder does."""
    while _RELEASED and _LOCK.acquire(blocking=False):
        dead = []
        try:
            while _RELEASED:
                file = _RELEASED.popleft()
                file.leases -= 1
                if file.leases == 0 and file in _FILES:
                    _FILES.remove(file)
                    dead.append(file)
        finally:
            _LOCK.release()
        for file in dead:
            file.segment.destroy()


def opened(file: str) -> tuple[int, mmap.mmap]:
    """This process's descriptor and mapping of table file ``file`` (one a process), opened
    the first time; each call is a user until ``let_go``. ``OSError`` where it is gone."""
    found = _OPENED.get(file)
    if found is None:
        fd = shm.open_memory_file(*shm.memory_file_name(file), os.O_RDWR)
        if fd is None:
            raise OSError(f"shared blocks {file}: the owner's descriptor names another file")
        try:
            mapping = mmap.mmap(fd, os.fstat(fd).st_size, **shm.UNTRACKED)
        except BaseException:
            os.close(fd)
            raise
        found = _OPENED[file] = [fd, mapping, 0]
    found[2] += 1
    return found[0], found[1]


def let_go(file: str) -> None:
    """One user of ``file`` less; the last closes its mapping and descriptor (every view of
    the mapping dropped first)."""
    found = _OPENED.get(file)
    if found is None:
        return
    found[2] -= 1
    if found[2] <= 0:
        del _OPENED[file]
        found[1].close()
        os.close(found[0])


def _forked() -> None:
    """A forked child leases none of the parent's files: they are the parent's to let go."""
    global _LOCK
    _LOCK = threading.Lock()
    _FILES.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
