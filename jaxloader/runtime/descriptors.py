"""The training process's file descriptors, which batch slots, workers' pipes and mapped
files share: what is open, the share of the limit a kind may keep, and the error for a table
that is full (``SharedMemoryError``: the limit, how to raise it, what to keep fewer of).

Example:
    >>> 4 <= descriptor_share(4, 256) <= 256
    True
"""

from __future__ import annotations

import os
import sys
from typing import Any

from jaxloader.base.errors import SharedMemoryError

# A mapping without a descriptor of its own (Python 3.13): before, ``mmap`` keeps a duplicate
# open (a worker's mapping of a slot, a source's block: two of the process's descriptors,
# often 1,024 at most); the owner's slots are mapped without one everywhere (runtime.mapping)
UNTRACKED: dict[str, Any] = {"trackfd": False} if sys.version_info >= (3, 13) else {}


def descriptors_of(token: str) -> list[int]:
    """This process's descriptors of the memory file named ``token`` (none found where the
    listing itself fails: out of descriptors, the error to raise is the one that said so)."""
    found: list[int] = []
    try:
        entries = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for entry in entries:
        try:
            if os.readlink(f"/proc/self/fd/{entry}").startswith(f"/memfd:{token} "):
                found.append(int(entry))
        except OSError:
            continue
    return found


def descriptor_share(share: int, most: int, untracked: bool = bool(UNTRACKED),
                     taken: int = 0) -> int:
    """Mappings this process may keep: ``1/share`` of its descriptor limit less ``taken``
    descriptors (those open, and other loaders' slots still to come), each mapping a
    descriptor (two before Python 3.13, where ``mmap`` keeps one of its own: ``untracked``
    false), 4 to ``most``.

    Example:
        >>> 4 <= descriptor_share(4, 256) <= 256
        True
    """
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return most
    return min(most, max(4, (soft - taken) // (share * (1 if untracked else 2))))


WORKER_DESCRIPTORS = 5  # the training process's descriptors a worker takes (its pipes, status
# and stack files, pidfd)


def open_descriptors() -> int | None:
    """The descriptors this process has open (Linux's ``/proc/self/fd``), or ``None``."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # (less the listing's own)
    except OSError:
        return None


FEWER = ("close the loaders you no longer use (each keeps its slots; a notebook keeps each "
          "loader a cell showed, in Out[n]: Out[n].close()), use fewer workers, or keep fewer "
          "batches alive (a leaf over 64 KiB that you keep, a NumPy batch's or one placed on "
          "the CPU backend, holds its batch's slot: keep a copy, np.array(leaf))")


def out_of_descriptors(e: OSError, what: str = "a new segment",
                       remedy: str = FEWER) -> SharedMemoryError:
    """The error for ``what`` (a segment) that a full descriptor table refused."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    raise_it = (f"raise the limit (ulimit -n {hard}, or resource.setrlimit(RLIMIT_NOFILE, "
                f"({hard}, {hard})) before the loader)" if hard > soft else
                "raise the limit (its hard limit too: as root, ulimit -n; in a container, "
                "docker run --ulimit nofile=65536)")
    return SharedMemoryError(
        f"shared memory: no descriptor left for {what} ({e.strerror}; this process may "
        f"hold {soft:,}, and a batch slot one while workers may open it): {raise_it}; "
        f"{remedy}")
