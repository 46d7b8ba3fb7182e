"""Decoded blocks shared by a loader's workers: each block (a Parquet row group) decoded once.

::

    main process:  SharedBlocks.create(count) ──> the table (a range of a memory file that
                   other sources' tables share: ``block_tables``): a slot per block
    a worker:      get(block, decode): lock the block's byte of the table, then
                     slot names a live file of this block?  ──> map it (no decode)
                     else decode, write it to a new memory file (Arrow IPC), publish the slot
                   unlock

Without it every worker decodes every block it reads, and with workers taking turns over a
read-local order every worker reads every block of a window: N workers decode N times.

Why it cannot leak or hang:
- Each decoded block is a memory file (``memfd_create``) made by the worker that decoded it,
  held open by that worker while the block is in its cache; others open it through
  ``/proc/<pid>/fd/<fd>``. The kernel frees a file when its last holder (open or mapped) is
  gone, so a worker that dies, or a killed loader, leaves nothing behind: nothing is ever named
  in ``/dev/shm``. (DESIGN.md has the main process make every segment; these are the one
  exception, and they keep that rule's reason: no leak, no SIGBUS, every page written before
  any process maps it.)
- The table belongs to the main process (a range of its ``Segment``), which workers map.
- A block is decoded under a POSIX record lock on its byte of the table: the kernel releases it
  when its holder dies, and a holder waits on nothing else, so a wait always ends.
- A slot is read under the block's lock (the publisher writes the rows, then the slot, before
  it unlocks), and checked: the file must still be open at that pid and descriptor, have that
  inode, and carry the block's number and the slot's nonce in its header (a descriptor or
  inode number reused by another file fails one of these). A failed check means a decode;
  memory or descriptors that run short, a private one.

Linux only (memory files); elsewhere each worker keeps its own cache, as in process.

Example:
    >>> import pyarrow as pa
    >>> table = SharedBlocks.create(4)            # main process
    >>> blocks = SharedBlocks(table.name, 4)      # in a worker
    >>> blocks.get(2, lambda: pa.table({"x": [1, 2]})).column("x").to_pylist()
    [1, 2]
    >>> blocks.release(2); blocks.close(); table.destroy()
    True
"""

from __future__ import annotations

import collections
import fcntl
import mmap
import os
import secrets
import warnings
import weakref
from typing import Any, Callable

import numpy as np

from jaxloader.base.errors import PerformanceWarning
from jaxloader.runtime import shm
from jaxloader.runtime.descriptors import descriptor_share
from jaxloader.sources import block_tables

# Decoded row groups a process keeps at most (``ParquetSource``'s cache): a row group shared
# by the workers is a mapping that holds a descriptor on Python < 3.13, and a process has ~1,024
MAX_CACHED_GROUPS = 256
_SLOT = 4  # int64s a slot: pid, descriptor, inode, nonce
_MAGIC = int.from_bytes(b"jxblock1", "little")
_HEAD = 64  # a block's file: magic, block, nonce, IPC length; the Arrow IPC stream from here
# Files a worker holds open for the others, oldest let go first (every table's together): a
# cache of many small row groups must not run a process out of descriptors (a soft limit of
# 1,024 is common), nor take more than an eighth of its limit (``max_owned``).
MAX_OWNED = 256
# Python's mmap keeps a duplicate of the descriptor it maps unless told not to (3.13 on):
# shm's, named here for the tests that map as 3.11 does
_UNTRACKED: dict[str, Any] = shm.UNTRACKED
# Before 3.13, each mapping alive (a cached row group's) holds a descriptor: they are counted,
# and past ``max_owned`` a block is decoded by this process alone (``_room``).
_MAPPINGS: "weakref.WeakSet[mmap.mmap]" = weakref.WeakSet()
# The files this process made and holds open for the others, of every table, oldest first:
# ``max_owned`` in all, not a table (a mixture of hundreds of one-file sources held as many)
_OWNED: "collections.OrderedDict[tuple[int, int], SharedBlocks]" = collections.OrderedDict()
# Pages mapped at once, not one fault at a time: a third of the cost of publishing a block
_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class SharedBlocks:
    """A worker's view of the table of ``count`` decoded blocks named ``name`` (a range of a
    memory file of the main process, from ``SharedBlocks.create``: ``block_tables``)."""

    def __init__(self, name: str, count: int) -> None:
        # The table file's one descriptor in this process, kept while a table of it is used
        # (``block_tables``): closing any descriptor of a file drops this process's record
        # locks on it. A block's lock is its byte of the file, its slot the same row.
        self._file, _, first = name.partition("@")
        self._base = int(first or 0)
        self._fd, mapping = block_tables.opened(self._file)
        self._slots = np.frombuffer(mapping, np.int64).reshape(-1, _SLOT)[
            self._base:self._base + count]
        self._owned: dict[int, int] = {}  # block -> descriptor of the file this process made
        self._most = max_owned()

    @staticmethod
    def create(count: int) -> block_tables.Lease:
        """The table for ``count`` blocks (main process), or raises ``SharedMemoryError``."""
        return block_tables.lease(count)

    def get(self, block: int, decode: Callable[[], Any], wait: bool = True) -> Any:
        """Block ``block`` as an Arrow table over shared memory, decoded by ``decode()`` (which
        returns a ``pyarrow.Table``) only if no worker has it; ``None`` when ``wait`` is false
        and another worker is decoding it now."""
        # Read under the lock too: its release and taking order the publisher's writes (the
        # rows, then the slot) before this read, where a CPU may reorder them (ARM).
        if not self._lock(block, wait):
            return None
        try:
            found = self._published(block)
            return found if found is not None else self._publish(block, decode())
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, self._base + block)

    def release(self, block: int) -> None:
        """This process's cache let ``block`` go, or the process holds too many such files
        (``_OWNED``): close the file if it made it (mappings, here and in other workers, stay
        valid until dropped; a worker that finds it closed decodes the block itself)."""
        _OWNED.pop((id(self), block), None)
        fd = self._owned.pop(block, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        for block in list(self._owned):
            self.release(block)
        del self._slots  # (a view of the map: the map closes only once no view holds it)
        block_tables.let_go(self._file)

    def _lock(self, block: int, wait: bool) -> bool:
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB), 1,
                        self._base + block)
        except (BlockingIOError, PermissionError):  # held by another worker (EAGAIN/EACCES)
            return False
        return True

    def _published(self, block: int) -> Any:
        pid, fd_number, inode, nonce = (int(v) for v in self._slots[block])
        if pid == 0 or not _room():
            return None
        try:
            fd = shm.open_memory_file(pid, fd_number, inode, os.O_RDONLY)
        except OSError:  # that worker let it go, or is gone
            return None
        if fd is None:  # the number names another file now
            return None
        try:
            mapping = mmap.mmap(fd, 0, flags=_FLAGS, prot=mmap.PROT_READ, **_UNTRACKED)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        _MAPPINGS.add(mapping)
        return _read(mapping, block, nonce)

    def _publish(self, block: int, table: Any) -> Any:
        """``table`` written to a new memory file, named in the slot, and returned read from
        it; ``table`` itself if the file cannot be made (memory or descriptors short).

        Written through the file, not into a mapping of it: the kernel gives a page written
        whole without zeroing it first and maps none, where reserving the file (fallocate)
        and populating a mapping zeroed and mapped each page before the copy. A write that finds no memory raises here,
        before the file is named in the slot, so nothing maps a page that is not there."""
        import pyarrow as pa

        if not _room():
            return table
        fd = -1
        try:
            fd = os.memfd_create(f"{shm.PREFIX}_block_{block}", os.MFD_CLOEXEC)
            with open(fd, "wb", closefd=False) as file:  # (buffered: a short write resumes)
                file.write(bytes(_HEAD))
                with pa.ipc.new_stream(pa.PythonFile(file, mode="w"), table.schema) as writer:
                    writer.write_table(table)
                length = file.tell() - _HEAD
            nonce = secrets.randbits(63)
            head = np.array([_MAGIC, block, nonce, length], np.int64).tobytes()
            if os.pwrite(fd, head, 0) != len(head):
                raise OSError("short write")
            mapping = mmap.mmap(fd, _HEAD + length, flags=_FLAGS, prot=mmap.PROT_READ,
                                **_UNTRACKED)
        except OSError:
            if fd >= 0:
                os.close(fd)
            return table  # this process keeps its own decode; the others decode theirs
        _MAPPINGS.add(mapping)
        self._owned[block] = fd
        _OWNED[(id(self), block)] = self
        while len(_OWNED) > self._most:  # (every table's: hundreds of sources in one worker)
            (_, oldest), owner = next(iter(_OWNED.items()))
            owner.release(oldest)
        self._slots[block] = (os.getpid(), fd, os.fstat(fd).st_ino, nonce)
        return _read(mapping, block, nonce)


def max_owned() -> int:
    """``MAX_OWNED``, or fewer where an eighth of this process's descriptor limit holds fewer
    files (each a descriptor, two before Python 3.13): at a limit of 128 a worker held 149
    and failed to open a Parquet file, naming the file as if it were at fault."""
    return descriptor_share(8, MAX_OWNED, bool(_UNTRACKED))


def _room() -> bool:
    """Whether a block may be mapped: from Python 3.13 always (a mapping holds no descriptor);
    before, while fewer than ``max_owned`` are alive in this process. A worker's cache of
    small row groups read from the others held 227 descriptors at a limit of 256, and ran out
    as it mapped a slot. The first refusal in a process warns (a worker's warning is warned
    again in the training process: workers/relay.py)."""
    if _UNTRACKED or len(_MAPPINGS) < (most := max_owned()):
        return True
    if not _WARNED:
        _WARNED.append(most)
        warnings.warn(_budget_said(most), PerformanceWarning, stacklevel=2)
    return False


_WARNED: list[int] = []  # (one warning a process)


def _budget_said(most: int) -> str:
    """Why a process maps no more than ``most`` shared row groups, and what to do."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if most >= MAX_OWNED or soft == resource.RLIM_INFINITY:
        why, raise_it = f"the most a process maps at once ({MAX_OWNED})", ""
    else:
        why = (f"a sixteenth of its descriptor limit, {soft:,}, before Python 3.13 (each "
               "mapping holds a descriptor, and Python's mmap one more)")
        raise_it = "raise the limit (ulimit -n, or resource.setrlimit before the loader is made), "
    return (f"ParquetSource(share_decoded=True): this process (pid {os.getpid()}) maps {most} "
            f"shared row groups, {why}; the others it reads at once it decodes for itself, as "
            f"each worker then does: {raise_it}read fewer row groups at once (a smaller "
            "LocalShuffle window), or use Python 3.13 or newer")


def _read(mapping: mmap.mmap, block: int, nonce: int) -> Any:
    """The table in a block's file if its header names ``block`` and ``nonce``, else ``None``."""
    import pyarrow as pa

    if len(mapping) < _HEAD:
        return None
    magic, found, found_nonce, length = (int(v) for v in np.frombuffer(mapping, np.int64, 4))
    if (magic, found, found_nonce) != (_MAGIC, block, nonce) or _HEAD + length > len(mapping):
        return None
    return pa.ipc.open_stream(pa.py_buffer(mapping)[_HEAD:_HEAD + length]).read_all()
