"""Which worker this process is, for the code it runs: ``get_worker_info()``.

A worker sets it once, before it loads its payload; the main process has none. Sources read it
to know they run in a worker (a ``ParquetSource`` shares decoded row groups between workers),
as PyTorch's ``get_worker_info()`` tells a dataset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, NoReturn

from jaxloader.base import read_threads


class WorkerInfo(NamedTuple):
    """What ``get_worker_info()`` returns inside a worker: its id, the workers in use as it
    started (``num_workers="auto"`` changes the count later; the loader, not the worker, picks
    the records a worker makes) and the loader's seed.

    Example:
        >>> import jaxloader as jl
        >>> jl.get_worker_info() is None  # in the training process
        True
        >>> def describe(record):  # a Map's function, run in a worker
        ...     info = jl.get_worker_info()
        ...     return {**record, "worker": -1 if info is None else info.id}
    """

    #: this worker's index, 0 to ``num_workers - 1``
    id: int
    #: the workers in use as it started
    num_workers: int
    #: the loader's seed
    seed: int


def _no_dataset(info: WorkerInfo) -> NoReturn:
    """Not given, unlike PyTorch's (an ``AttributeError`` that says what to do)."""
    raise AttributeError(
        "WorkerInfo has no dataset (PyTorch's get_worker_info().dataset): open what a worker "
        "needs (a file, a client) lazily, on first use, in the source's __getitem__ or in the "
        "transform; each worker has its own copy of the source")


if not TYPE_CHECKING:  # (set here, a NamedTuple's body holds fields: a type checker says it
    WorkerInfo.dataset = property(_no_dataset)  # is not there; NoReturn passed it)


_INFO: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """``WorkerInfo(id, num_workers, seed)`` inside a worker process, ``None`` elsewhere.

    Example:
        >>> import jaxloader as jl
        >>> jl.get_worker_info() is None  # in the main process
        True
    """
    return _INFO


def set_info(info: WorkerInfo, capacity: int | None = None) -> None:
    """This process is worker ``info.id`` (called once, by the worker as it starts) of a pool
    that may run ``capacity`` workers (``num_workers="auto"``'s most; ``info.num_workers`` where
    not given): its read threads stay from one task to the next (``base.read_threads.keep``)."""
    global _INFO, _CAPACITY
    _INFO, _CAPACITY = info, max(info.num_workers, capacity or 0)
    read_threads.keep()


def capacity() -> int:
    """The most workers this worker's pool may run (0 outside a worker): a worker started first
    under ``num_workers="auto"`` is told 1 in use, and may have others beside it later (a
    ``ParquetSource`` shares what its workers decode where there may be more than one)."""
    return max(_CAPACITY, _INFO.num_workers if _INFO is not None else 0)


_CAPACITY = 0
