"""Shared-memory segments: the main process owns them, workers only map them.

Two kinds, one interface (``Segment`` on the owner's side, ``attach(name, size)`` on a worker's):

- **Memory files** (Linux, the default there): ``os.memfd_create``. Nothing appears in
  ``/dev/shm``, so the size of that mount (64 MB in a default container) does not limit them, and
  the kernel frees a file when the last process holding it (open or mapped) is gone: a killed
  owner leaks nothing, with no tracker to trust. The owner keeps the file open; a worker opens
  it through ``/proc/<owner pid>/fd/<fd>`` and checks its inode, so a reused descriptor number can
  never map the wrong file. The name is ``memfd:<owner pid>:<fd>:<inode>``.
- **POSIX shared memory** (elsewhere, or where the kernel or a sandbox refuses memory files):
  ``jaxloader_<owner pid>_<random>`` in ``/dev/shm``, registered with Python's resource tracker
  while it exists so that a killed owner's segments are unlinked. ``attach`` maps it without
  registering it (on Python 3.11 a tracker would unlink the owner's segment when the worker
  exits). Workers never unlink.

Either way the pages are reserved when the segment is made (``posix_fallocate``): memory that
runs out is a ``SharedMemoryError`` there, naming the bytes asked for and what was free, never a
SIGBUS in the middle of a copy (what writing past a full ``/dev/shm`` does).

Example:
    >>> seg = Segment.create(4096)
    >>> view = attach(seg.name, seg.size)
    >>> view[0] = 7; seg.buf[0]
    7
    >>> view.close(); seg.destroy()
    True
"""

from __future__ import annotations

import errno
import mmap
import os
import resource
import secrets
import weakref
from multiprocessing import resource_tracker
from typing import Any, cast

import _posixshmem  # CPython's binding of shm_open/shm_unlink (what shared_memory uses)
import numpy as np

from jaxloader.base.errors import JaxloaderError, SharedMemoryError
from jaxloader.base.interrupts import run_all
from jaxloader.runtime.descriptors import UNTRACKED, descriptors_of, out_of_descriptors
from jaxloader.runtime.mapping import mapped

PREFIX = "jaxloader"
_PAGE = mmap.PAGESIZE
_MEMFD = "memfd"
# Memory files need memfd_create, which the kernel and the sandbox allow, and a /proc to hand
# them over by (a pipe, too: ``workers.stacks``).
PROC_FDS = os.path.isdir("/proc/self/fd")


def _memfd_works() -> bool:
    """Whether a memory file can be made here: an old kernel under a newer C library (an
    Apptainer image of Ubuntu 22.04 on a CentOS 7 host) says ENOSYS, a seccomp profile EPERM,
    and the loader failed as it was made, with a bare ``OSError`` (the containers audit)."""
    if not (hasattr(os, "memfd_create") and PROC_FDS):
        return False
    try:
        os.close(os.memfd_create(f"{PREFIX}_probe", os.MFD_CLOEXEC))
    except OSError as e:  # (no descriptor left now: made later, or refused by name then)
        return e.errno in (errno.EMFILE, errno.ENFILE)
    return True


def memfd_available() -> bool:
    """Whether memory files can be made here (``MEMFD_AVAILABLE``), found the first time it
    is asked, not at import: a seccomp profile that kills a process making one (systemd's
    SystemCallFilter) ended ``import jaxloader``, where a loader without workers never makes
    one (the review)."""
    found = globals().get("MEMFD_AVAILABLE")
    if found is None:
        found = globals()["MEMFD_AVAILABLE"] = _memfd_works()
    return bool(found)


def __getattr__(name: str) -> Any:
    if name == "MEMFD_AVAILABLE":  # (shm.MEMFD_AVAILABLE: asked once; a test may set it)
        return memfd_available()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

class Segment:
    """An owned segment: ``buf`` is its memoryview; ``destroy()`` releases it.

    ``close()`` never raises: a mapping that NumPy views still read is unmapped when the last
    view dies (the views keep the ``mmap`` object alive; its deallocation unmaps it).
    """

    def __init__(self, name: str, mapping: mmap.mmap | np.ndarray, size: int,
                 fd: int = -1) -> None:
        self.name = name
        self.size = size
        self._mmap: mmap.mmap | np.ndarray | None = mapping  # (mapping.mapped's)
        self.buf: memoryview | None = memoryview(cast(Any, mapping))  # (an array: a buffer)
        self._fd = fd  # a memory file's descriptor, held while workers may still open it
        self._linked = True

    @classmethod
    def create(cls, size: int, prefault: bool = True,
               registry: dict[str, "Segment"] | None = None,
               memfd: bool | None = None) -> "Segment":
        """A new segment of at least ``size`` bytes (rounded up to whole pages), its pages
        reserved; a memory file unless ``memfd=False`` or the platform has none.

        It enters ``registry`` (name -> segment) as soon as it exists, so a create cut short by
        a Ctrl-C either releases the segment or leaves it where its owner's ``close()`` finds it
        (``jaxloader.base.interrupts``, 3).
        """
        size = max(_PAGE, -(-size // _PAGE) * _PAGE)
        use_memfd = memfd_available() if memfd is None else memfd
        segment = (cls._create_memfd if use_memfd else cls._create_posix)(size, registry)
        if prefault:  # first touch of a fresh page costs far more than a warm write: pay it now
            try:
                np.frombuffer(segment.memory, np.uint8).fill(0)
            except BaseException:  # (a Ctrl-C: its memory file was left open for good)
                if registry is not None:
                    registry.pop(segment.name, None)
                segment.destroy()
                raise
        return segment

    @classmethod
    def _create_memfd(cls, size: int, registry: dict | None) -> "Segment":
        token = f"{PREFIX}_{secrets.token_hex(6)}"
        fd, name = -1, ""
        try:
            fd = os.memfd_create(token, os.MFD_CLOEXEC)
            reserve(fd, size, "memory")
            name = f"{_MEMFD}:{os.getpid()}:{fd}:{os.fstat(fd).st_ino}"
            segment = cls(name, mapped(fd, size), size, fd)
            if registry is not None:
                registry[name] = segment
        except BaseException as e:
            # By token: a Ctrl-C right after memfd_create returns loses the number, not the file.
            for leftover in [fd] if fd >= 0 else descriptors_of(token):
                os.close(leftover)
            if registry is not None:
                registry.pop(name, None)
            if isinstance(e, OSError) and e.errno in (errno.EMFILE, errno.ENFILE):
                raise out_of_descriptors(e) from e
            if isinstance(e, OSError) and e.errno == errno.ENOMEM:
                raise unmappable(size, e) from e
            raise
        return segment

    @classmethod
    def _create_posix(cls, size: int, registry: dict | None) -> "Segment":
        name = f"{PREFIX}_{os.getpid()}_{secrets.token_hex(6)}"
        fd = -1
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
            reserve(fd, size, "/dev/shm")
            segment = cls(name, mapped(fd, size), size)
            if registry is not None:
                registry[name] = segment
            resource_tracker.register("/" + name, "shared_memory")
        except BaseException as e:
            try:  # by name: a Ctrl-C right after shm_open returns loses the fd, not the name
                _posixshmem.shm_unlink("/" + name)
            except OSError:  # (not made; or a read-only /dev/shm, said below)
                pass
            if registry is not None:
                registry.pop(name, None)
            if isinstance(e, OSError) and e.errno == errno.ENOMEM:
                raise unmappable(size, e) from e
            if isinstance(e, OSError) and e.errno in (errno.EROFS, errno.ENOENT, errno.EACCES,
                                                       errno.ENOSPC):
                what = ("which has no room for another file (its inodes are used up: df -i "
                        "/dev/shm; mount it with more, nr_inodes=0 for no limit)" if e.errno ==
                        errno.ENOSPC else "which must be a writable tmpfs")  # (a bare "No
                raise SharedMemoryError(  # space left", "Read-only file system: '/jaxloader_'")
                    f"shared memory: could not create a segment of {size:,} bytes in /dev/shm "
                    f"({e.strerror}): on this system the loader's shared memory is POSIX "
                    f"shared memory, in /dev/shm, {what} (in a container: docker run "
                    "--shm-size=1g, or mount a tmpfs there); or use num_workers=0") from e
            raise
        finally:
            if fd >= 0:
                os.close(fd)
        return segment

    @property
    def linked(self) -> bool:
        """Whether new workers can still open it (``unlink`` not called)."""
        return self._linked

    @property
    def memory(self) -> memoryview:
        """``buf`` of a segment that is still mapped here."""
        if self.buf is None:
            raise JaxloaderError(f"shared memory {self.name}: used after close()")
        return self.buf

    def unlink(self) -> None:
        """Makes the segment unreachable for new workers (mappings stay valid). Idempotent."""
        if not self._linked:
            return
        self._linked = False
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)  # the kernel frees the memory once no mapping is left either
            return
        try:
            _posixshmem.shm_unlink("/" + self.name)
        except FileNotFoundError:
            pass
        resource_tracker.unregister("/" + self.name, "shared_memory")

    def close(self) -> bool:
        """Drops this mapping; True if unmapped now, False if views still read it."""
        buf, mapping = self.buf, self._mmap
        self.buf = self._mmap = None
        if mapping is None or buf is None:
            return True
        try:
            buf.release()
            if isinstance(mapping, mmap.mmap):
                mapping.close()
                return True
        except BufferError:
            return False
        gone = weakref.ref(mapping)  # an array's (runtime.mapping): unmapped with its last view
        del mapping
        return gone() is None

    def destroy(self) -> bool:
        self.unlink()
        return self.close()


def destroy_all(segments: list[Segment]) -> None:
    """Destroys every segment of ``segments`` (each tried, an interrupt raised after them) and
    empties the list."""
    run_all([s.destroy for s in segments])
    segments.clear()


# what the errors below advise of the batch slots' memory (payload.py says a source's copy's
# remedies in its place)
SLOTS_REMEDY = "use smaller batches, fewer workers or prefetch"


def unmappable(size: int, e: OSError) -> SharedMemoryError:
    """The error for a segment whose mapping the address space refused (``ulimit -v``, as HPC
    schedulers set it, or ``vm.max_map_count`` mappings), not the memory."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    limit = "not limited" if soft == resource.RLIM_INFINITY else f"limited to {soft:,} bytes"
    return SharedMemoryError(
        f"shared memory: could not map {size:,} bytes ({e.strerror}): this process's address "
        f"space is {limit} (ulimit -v, RLIMIT_AS: batch slots and the source count against "
        f"it), or it holds vm.max_map_count mappings; raise the limit, or {SLOTS_REMEDY}")


def reserve(fd: int, size: int, where: str) -> None:
    """Sizes the file and reserves its pages, or raises ``SharedMemoryError`` (a file-size
    limit, ``ulimit -f``, too: memory files count against it, and its bare "File too large"
    was blamed on the source's pickling)."""
    from jaxloader.runtime.limits import reservable_bytes

    room = reservable_bytes()  # (a cgroup's limit fails no reservation: the kernel kills.
    # Each time, ~0.15 ms: a measure kept 0.5 s missed what the workers took meanwhile)
    if size > room:
        raise SharedMemoryError(
            f"shared memory: could not reserve {size:,} bytes in {where}: {room:,} bytes of "
            "memory are left to this process (its container's or cgroup's limit less what it "
            "uses, with free swap), and the kernel would end a process without an error "
            f"rather than refuse the reservation. {SLOTS_REMEDY.capitalize()}, or free memory "
            "(or raise the container's memory limit).")
    try:
        os.ftruncate(fd, size)
        if hasattr(os, "posix_fallocate"):  # (macOS has none: its pages come as written)
            os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL) and os.fstat(fd).st_size == size:
            return  # (a file system that reserves nothing ahead: sized, as macOS's)
        if e.errno not in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0] if e.errno == errno.EFBIG else -1
        raise SharedMemoryError(
            f"shared memory: could not reserve {size:,} bytes in {where} ({e.strerror}); "
            + (f"the file-size limit is {limit:,} bytes (ulimit -f, RLIMIT_FSIZE: a "
               "scheduler's, LSF's bsub -F, SGE's h_fsize), which memory files count against: "
               "raise it (ulimit -f unlimited), or use smaller batches and arrays"
               if 0 <= limit < size else
               f"{_free(where)}. {SLOTS_REMEDY.capitalize()}, or free memory"
               + ("; in a container, give it a larger /dev/shm (docker run --shm-size=2g)"
                  if where == "/dev/shm" else "")) + "."
        ) from None


def _free(where: str) -> str:
    """What was free, for the error message: in ``/dev/shm``, or of the memory this process
    may take (at most what its container's limit leaves: the node's was quoted)."""
    from jaxloader.runtime.limits import available_bytes

    try:
        if where == "/dev/shm":
            st = os.statvfs("/dev/shm")
            return f"{st.f_bavail * st.f_frsize:,} bytes were free in /dev/shm"
    except OSError:
        return "how much was free is unknown"
    available = available_bytes()
    return "how much was free is unknown" if available >= 1 << 62 else \
        f"{available:,} bytes of memory were available"


def open_memory_file(pid: int, fd_number: int, inode: int, flags: int) -> int | None:
    """A descriptor of the memory file that process ``pid`` holds as ``fd_number``, opened with
    ``flags`` through ``/proc``; ``None`` if that number now names another file (not ``inode``).
    Raises ``OSError`` if the process or its descriptor is gone, or it may not be opened."""
    path = f"/proc/{pid}/fd/{fd_number}"
    try:
        fd = os.open(path, flags | os.O_CLOEXEC)
    except PermissionError as e:  # (it said a bare "Permission denied", blamed on the payload)
        raise PermissionError(
            e.errno, f"{e.strerror}: {path}, process {pid}'s shared memory, which a worker "
            "opens through /proc: the kernel allows that only while that process is dumpable "
            "and this /proc is its PID namespace's. A training process that changed its user "
            "(os.setuid) or called prctl(PR_SET_DUMPABLE, 0) is not: make the loaders before "
            "that, or run as that user from the start; in a PID namespace of its own, mount "
            "its /proc (unshare --fork --pid --mount-proc)") from None
    if os.fstat(fd).st_ino != inode:
        os.close(fd)
        return None
    return fd


def memory_file_name(name: str) -> tuple[int, int, int]:
    """``(pid, fd_number, inode)`` of a memory file's ``memfd:<pid>:<fd>:<inode>`` name."""
    _, pid, fd_number, inode = name.split(":")
    return int(pid), int(fd_number), int(inode)


def attach(name: str, size: int) -> mmap.mmap:
    """Maps the owner's segment ``name`` read-write without registering it anywhere."""
    if name.startswith(_MEMFD + ":"):
        fd = open_memory_file(*memory_file_name(name), os.O_RDWR)
        if fd is None:
            raise JaxloaderError(
                f"shared memory {name}: the owner's descriptor now names another file; the "
                "segment was released before this worker mapped it"
            )
        try:
            return mmap.mmap(fd, size, **UNTRACKED)
        finally:
            os.close(fd)
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, size, **UNTRACKED)
    finally:
        os.close(fd)
