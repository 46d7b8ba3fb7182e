"""A shared, read-write mapping of a file that keeps no descriptor of its own, on every Python.

A batch slot's memory file holds one descriptor of the training process while workers may open
it, and none once unlinked (``shm.Segment.unlink``): its batch may then be kept (``list(loader)``)
for as long as the user likes, with no descriptor. Python's ``mmap.mmap(fd)`` keeps a duplicate
of ``fd`` open for its life before 3.13 (``trackfd=False`` came in 3.13), so a kept batch held a
descriptor there, and 857 kept batches filled a limit of 1,024 on Python 3.11. ``mapped`` calls
the C library's ``mmap`` itself (``ctypes``) where Python's would keep one: the mapping is an
object NumPy reads through its ``__array_interface__``, unmapped (``munmap``) when it and every
array and memoryview over it are gone, as an ``mmap`` object is.

Example:
    >>> import os
    >>> fd = os.memfd_create("example")
    >>> os.ftruncate(fd, 4096)
    >>> view = memoryview(mapped(fd, 4096))
    >>> os.close(fd)  # (the mapping needs no descriptor)
    >>> view[:3] = b"abc"
    >>> bytes(view[:3]), len(view)
    (b'abc', 4096)
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from typing import Any

import numpy as np

# Python's own mmap keeps no descriptor from 3.13 (trackfd=False): used there, as tested longest
NATIVE = sys.version_info >= (3, 13)
_NO_DESCRIPTOR: dict[str, Any] = {"trackfd": False}
_libc: Any = None


def _c_library() -> Any:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long)
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        _libc = libc
    return _libc


class _Mapping:
    """``size`` bytes at ``address``, mapped here; unmapped when the last reference goes."""

    def __init__(self, address: int, size: int) -> None:
        self.address, self.size = address, size
        self.__array_interface__ = {"data": (address, False), "shape": (size,),
                                    "typestr": "|u1", "version": 3}
        self._munmap = _c_library().munmap  # (held: at exit, the module's names may be gone)

    def __del__(self) -> None:
        self._munmap(self.address, self.size)


def mapped(fd: int, size: int) -> mmap.mmap | np.ndarray:
    """The first ``size`` bytes of file ``fd``, shared and writable: an ``mmap`` (Python 3.13
    on; ``close()`` unmaps it) or a 1-D uint8 array (unmapped when it and its views are gone);
    ``fd`` may be closed at once. Raises ``OSError`` as ``mmap`` does (``ENOMEM``: the address
    space refused)."""
    if NATIVE:
        return mmap.mmap(fd, size, **_NO_DESCRIPTOR)
    libc = _c_library()
    address = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if address is None or address == ctypes.c_void_p(-1).value:  # MAP_FAILED
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return np.asarray(_Mapping(address, size))
