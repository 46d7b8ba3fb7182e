"""The worker pools open in this process, and a warning where many are: each keeps its worker
processes and batch slots (memory, a descriptor each) until its loader is closed or collected,
with its iterators (a ``DataLoader``'s iterator holds the pool, and keeps it past its loader).
A notebook keeps every value a cell showed (``Out[n]``, ``_``), so a cell that ends by showing
a loader and runs again piled up workers and descriptors until a new loader found none left,
with nothing said before.

Example:
    >>> import warnings
    >>> class Pool:
    ...     pids = [101, 102]
    >>> pool, before = Pool(), len(_POOLS)
    >>> with warnings.catch_warnings():  # (said where it makes MANY_OPEN open, 2x, 4x, ...)
    ...     warnings.simplefilter("ignore")
    ...     started("DataLoader 1 (ArraySource, batch_size 8)", pool)
    >>> len(_POOLS) - before
    1
    >>> closed(pool)
    >>> len(_POOLS) - before
    0
"""

from __future__ import annotations

import gc
import os
import threading
import warnings
import weakref
from typing import Any

from jaxloader.base.errors import JaxloaderWarning, user_stacklevel

MANY_OPEN = 6  # loaders with workers open at once said (then 12, 24, ...)
_POOLS: weakref.WeakSet = weakref.WeakSet()  # those not closed (collected: gone from it)
_LOCK = threading.Lock()  # (loaders made, and closed, in several threads at once)


def _forked() -> None:
    """A forked child has none of its parent's workers, nor the lock another thread held."""
    global _LOCK
    _POOLS.clear()
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def started(label: str, pool: Any) -> None:
    """``pool`` (its ``pids``) started by the loader ``label``: warns where that makes
    ``MANY_OPEN`` (or twice, four times as many) pools open in this process."""
    with _LOCK:
        _POOLS.add(pool)
        running = _counts()
    times, rest = divmod(len(running), MANY_OPEN)
    if not times or rest or times & (times - 1):
        return
    # loaders only a cycle holds (a notebook's interrupted cells: IPython keeps each
    # traceback it replaced in one) are closed by a collection, not counted (the env audit);
    # outside the lock (a collection runs finalizers); at 6, 12, 24, ... loaders alone
    gc.collect()
    with _LOCK:
        if len(running := _counts()) < times * MANY_OPEN:
            return
    warnings.warn(
        f"{label}: {len(running)} loaders with workers are open in this "
        f"process, with {sum(running)} worker processes and their batch slots (memory, a "
        "descriptor each), until each is closed or collected; close() the loaders you are "
        "done with (or make them in a 'with' block). In a notebook, a cell that ends by "
        "showing a loader or its iterator keeps it in Out[n] and _ however often the cell runs "
        "again: end such a cell with ';'; Out[n].close() closes one kept, and %reset -f out "
        "then get_ipython().user_ns_hidden.update(_='', __='', ___='') lets go of them all "
        "(IPython keeps the last three shown there past the reset)",
        JaxloaderWarning,
        stacklevel=user_stacklevel())


def _counts() -> list[int]:
    """The workers running of each pool open that has any."""
    return [n for n in (_running(each.pids) for each in list(_POOLS)) if n]


def _running(pids: list[int]) -> int:
    """How many of ``pids`` run: none of a pool its workers' error broke, whose loader is not
    collected yet (held in a cycle by the error's traceback), though its workers ended."""
    count = 0
    for pid in pids:
        try:
            os.kill(pid, 0)
            count += 1
        except ProcessLookupError:
            pass
        except OSError:  # (another user's process, or not to be asked: taken as running)
            count += 1
    return count


def closed(pool: Any) -> None:
    """``pool``'s loader was closed: its workers end, and it is not counted."""
    with _LOCK:
        _POOLS.discard(pool)
