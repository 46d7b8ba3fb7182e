"""Engines make the batches of a run of steps, in order; a DataLoader has one.

::

    DataLoader ── engine.batches(start, stop) ──> batch of start, start+1, ... (stop: exclusive,
                                                 None: endless), each a pure function of its step
               └─ engine.close()

Two engines: ``InProcessEngine`` (``num_workers=0``, in the calling thread) and
``jaxloader.workers.pool.WorkerPool`` (worker processes). A new ``batches()`` run makes older
runs stale; closing a run's generator returns whatever it holds. A ``StreamLoader`` drives
the same ``WorkerPool`` (or its own in-process engine) with each reader's state to start from
and a dict for the reports of the batches handed out (``jaxloader.loaders.stream_loader``).

Example:
    >>> import numpy as np
    >>> from jaxloader.batching.batch_maker import BatchMaker
    >>> from jaxloader.order.sampling import Sampler
    >>> from jaxloader.sources import ArraySource
    >>> maker = BatchMaker(ArraySource({"x": np.arange(6)}),
    ...                    Sampler(6, 2, shuffle=False, seed=0, last_batch="drop"))
    >>> [b["x"].tolist() for b in InProcessEngine(maker).batches(1, 3)]
    [[2, 3], [4, 5]]
"""

from __future__ import annotations

import itertools
from typing import Any, Generator, Protocol

from jaxloader.batching.batch_maker import BatchMaker


class Engine(Protocol):
    """The contract between a DataLoader and what makes its batches."""

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers (empty when there are none)."""
        ...

    def batches(self, start: int, stop: int | None) -> Generator[Any, None, None]:
        """The batches of steps ``start``, ``start + 1``, ... up to ``stop`` (or endless);
        closing the generator releases what the run holds."""
        ...

    def close(self) -> None:
        """Releases workers and buffers; idempotent."""
        ...


class InProcessEngine:
    """Makes batches in the calling thread (``num_workers=0``)."""

    def __init__(self, maker: BatchMaker) -> None:
        self._maker = maker

    @property
    def pids(self) -> list[int]:
        return []

    def batches(self, start: int, stop: int | None) -> Generator[Any, None, None]:
        steps = itertools.count(start) if stop is None else range(start, stop)
        make = self._maker.make
        for step in steps:
            yield make(step)[0]

    def close(self) -> None:
        pass
