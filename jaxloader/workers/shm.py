"""POSIX shared-memory segments: the main process owns them, workers only attach.

- ``Segment`` (owner side) creates, pre-faults and unlinks. Names are
  ``jaxloader_<owner pid>_<random>`` so a leak is easy to find and clean. Each segment is
  registered with Python's resource tracker while it exists: if the owner is killed, the tracker
  unlinks it.
- ``attach`` (worker side) maps a segment with ``shm_open`` + ``mmap`` and never registers it
  with a resource tracker (on Python 3.11 a tracker would unlink the owner's segment when the
  worker exits). Workers never unlink.

Example:
    >>> seg = Segment.create(4096)
    >>> view = attach(seg.name, seg.size)
    >>> view[0] = 7; seg.buf[0]
    7
    >>> view.close(); seg.destroy()
    True
"""

from __future__ import annotations

import mmap
import os
import secrets
from multiprocessing import resource_tracker

import _posixshmem  # CPython's binding of shm_open/shm_unlink (what shared_memory uses)
import numpy as np

PREFIX = "jaxloader"
_PAGE = mmap.PAGESIZE


def segment_name() -> str:
    return f"{PREFIX}_{os.getpid()}_{secrets.token_hex(6)}"


class Segment:
    """An owned segment: ``buf`` is its memoryview; ``destroy()`` unlinks and unmaps it.

    Registered with Python's resource tracker while linked, so a killed owner leaks nothing.
    ``close()`` never raises: a mapping that NumPy views still read is unmapped when the last
    view dies (the views keep the ``mmap`` object alive; its deallocation unmaps it).
    """

    def __init__(self, name: str, mapping: mmap.mmap, size: int) -> None:
        self.name = name
        self.size = size
        self._mmap: mmap.mmap | None = mapping
        self.buf: memoryview | None = memoryview(mapping)
        self._linked = True

    @classmethod
    def create(cls, size: int, prefault: bool = True,
               registry: dict[str, "Segment"] | None = None) -> "Segment":
        """A new segment of at least ``size`` bytes (rounded up to whole pages).

        It enters ``registry`` (name -> segment) as soon as it exists, so a create cut short by
        a Ctrl-C either unlinks the segment or leaves it where its owner's ``close()`` finds it.
        """
        size = max(_PAGE, -(-size // _PAGE) * _PAGE)
        name = segment_name()
        fd = -1
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
            os.ftruncate(fd, size)
            segment = cls(name, mmap.mmap(fd, size), size)
            if registry is not None:
                registry[name] = segment
            resource_tracker.register("/" + name, "shared_memory")
        except BaseException:
            try:  # by name: a Ctrl-C right after shm_open returns loses the fd, not the name
                _posixshmem.shm_unlink("/" + name)
            except FileNotFoundError:
                pass
            if registry is not None:
                registry.pop(name, None)
            raise
        finally:
            if fd >= 0:
                os.close(fd)
        if prefault:  # first touch of a fresh shared page costs ~30x a warm write: pay it now
            np.frombuffer(segment.buf, np.uint8).fill(0)
        return segment

    def unlink(self) -> None:
        """Removes the name from /dev/shm; mappings stay valid until closed. Idempotent."""
        if self._linked:
            self._linked = False
            try:
                _posixshmem.shm_unlink("/" + self.name)
            except FileNotFoundError:
                pass
            resource_tracker.unregister("/" + self.name, "shared_memory")

    def close(self) -> bool:
        """Drops this mapping; True if unmapped now, False if views still read it."""
        buf, mapping = self.buf, self._mmap
        self.buf = self._mmap = None
        if mapping is None:
            return True
        try:
            buf.release()
            mapping.close()
        except BufferError:
            return False
        return True

    def destroy(self) -> bool:
        self.unlink()
        return self.close()


def attach(name: str, size: int) -> mmap.mmap:
    """Maps the owner's segment ``name`` read-write without registering it anywhere."""
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)
