"""Engines make the batches of a run of steps, in order; a loader has one.

::

    loader ── engine.batches(start, stop[, resets, reports]) ──> batch of start, start+1, ...
                                                 (stop: exclusive, None: endless), each a pure
                                                 function of its step
           └─ engine.close()

Two engines: ``InProcessEngine`` (``num_workers=0``, in the calling thread) and
``jaxloader.workers.pool.WorkerPool`` (worker processes); both make the batches of a ``Maker``
(a source's ``BatchMaker`` or a stream's ``StreamBatchMaker``). A stream's run passes
``resets`` (each host's reader states to continue from) and ``reports`` (filled with the reader
state after each batch handed out). A new ``batches()`` run makes older runs stale; closing a
run's generator returns whatever it holds.

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
import threading
from time import perf_counter
from typing import Any, Callable, Generator, Iterator, Protocol, runtime_checkable

from jaxloader.base.errors import CollateError, JaxloaderError, SharedMemoryError
from jaxloader.base.source_locks import holding, lock_of, made_under, source_lock
from jaxloader.base.timings import Gauges, StageClock
from jaxloader.engines.stall_watch import StallWatch
from jaxloader.runtime.limits import memory_left
from jaxloader.sources.parts import walk


class Maker(Protocol):
    """What an engine makes batches with (``BatchMaker``, ``StreamBatchMaker``)."""

    source: Any  # what it reads (named when it cannot be sent to a worker)
    record_transforms: tuple
    batch_transforms: tuple
    clock: StageClock  # its batches' stage timings, in the process that runs it

    @property
    def seed(self) -> int: ...

    def make(self, step: int, alloc: Callable[[int], Any] | None = None) -> tuple[Any, Any]:
        """The batch of ``step`` and its layout, written into ``alloc(nbytes)`` if given."""
        ...

    def make_steps(self, steps: list[int], allocs: list[Callable[[int], Any]]
                   ) -> Iterator[tuple[Any, Any]]:
        """``make(step, alloc)`` for each of ``steps`` (a worker's task), in order."""
        ...

    def location(self, step: int, named: bool = True) -> str:
        """Where step ``step``'s batch is, for messages; ``named``: its records' files too,
        where they are few and the message names no record of its own."""
        ...


@runtime_checkable
class StreamMaker(Maker, Protocol):
    """A ``Maker`` of a stream's batches (``StreamBatchMaker``): its readers continue from
    states given, and say theirs after each batch."""

    def reset(self, state: dict | list | None) -> None:
        """Hosts the readers of ``state`` (one's, a list, or ``None``: the first's start)."""
        ...

    def report(self) -> dict:
        """The state of the last batch's reader after it."""
        ...


class Engine(Protocol):
    """The contract between a loader and what makes its batches."""

    gauges: Gauges  # the stage timings of the processes that make its batches

    @property
    def active(self) -> int:
        """Worker processes in use now (0: batches are made in the calling thread)."""
        ...

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers (empty when there are none)."""
        ...

    def batches(self, start: int, stop: int | None, resets: list | None = None,
                reports: dict | None = None) -> Generator[Any, None, None]:
        """The batches of steps ``start``, ``start + 1``, ... up to ``stop`` (or endless);
        closing the generator releases what the run holds. A stream's run: ``resets``, each
        host's reader states; ``reports[step]``, the reader's state after that batch."""
        ...

    def close(self) -> None:
        """Releases workers and buffers; idempotent."""
        ...


def made_here(maker: Maker, step: int) -> tuple[Any, Any]:
    """``maker.make(step)`` in this process; a collation error names the step first, as a
    worker's error does (``workers.failures``)."""
    locks = source_lock(maker.source, walk)  # (peek() and other loaders may read it too)
    try:
        if getattr(maker, "reads_under_locks", False):  # its reads hold them, not transforms;
            # and one batch of a maker at a time (peek()'s is a copy beside the device-put
            # thread's: they share its record generator, its sampler's memo and caches)
            with lock_of(getattr(maker, "sampler")):
                made = made_under(locks, maker.make, step)
            return made
        return holding(locks, maker.make, step)
    except CollateError as e:
        e.args = (f"{maker.location(step, False)}: {e}",)  # (its records named in it)
        raise
    except MemoryError as e:  # (the batch's arrays; a source's or transform's: a RecordError)
        if isinstance(e, JaxloaderError):
            raise
        raise SharedMemoryError(
            f"{maker.location(step, False)}: no memory for its batch in the training process "
            f"({e}): {memory_left()}; use smaller batches, or free memory") from e


class Runs:
    """An engine's runs (``batches()`` calls), numbered as they are made, not at their first
    ``next()``: the newest is the live one. An older one that another thread still drives (an
    ``iter()`` made while its ``next()`` ran cannot close a running generator) ends at its next
    turn, before it touches what the live run uses (a stream's readers, a pool's pipes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._newest = 0

    def made(self) -> int:
        """A new run's number."""
        with self._lock:
            self._newest += 1
            return self._newest

    def stale(self, run: int) -> bool:
        return run != self._newest


class InProcessEngine:
    """Makes batches in the calling thread (``num_workers=0``); a stream's one host is this
    process, with all its readers (``resets[0]``)."""

    def __init__(self, maker: Maker, stall_warning_s: float | None = None,
                 label: str = "") -> None:
        """``stall_warning_s``: a batch made for longer is said in the log, with the stack of
        the thread making it, and again each time as long (``StallWatch``)."""
        self._maker = maker
        self._watch = StallWatch(stall_warning_s, label, lambda step: maker.location(step,
                                                                                   False))
        self.gauges = Gauges(1)
        self.gauges.makers[0].pull = self._pull
        self._busy = 0.0  # seconds spent making batches since the last pull
        # One thread makes a batch at a time, of the newest run: an iter() from another thread
        # while a next() makes a batch cannot stop that run (its generator is running), and a
        # stream's maker is one object (reset() closes the readers the batch reads from)
        self._driver = threading.RLock()  # (held while a batch is made, not across a yield)
        self._runs = Runs()

    @property
    def pids(self) -> list[int]:
        return []

    @property
    def active(self) -> int:
        return 0

    def batches(self, start: int, stop: int | None, resets: list | None = None,
                reports: dict | None = None) -> Generator[Any, None, None]:
        return self._batches(self._runs.made(), start, stop, resets, reports)

    def _batches(self, issued: int, start: int, stop: int | None, resets: list | None,
                 reports: dict | None) -> Generator[Any, None, None]:
        maker = self._maker
        stream = maker if isinstance(maker, StreamMaker) else None
        with self._driver:
            if self._runs.stale(issued):  # (a newer run: its iterator says this one is stale)
                return
            if stream is not None and resets is not None:
                stream.reset(resets[0])
            if (maker.clock.trace is not None) != self.gauges.trace:
                maker.clock.trace = [] if self.gauges.trace else None
        steps = itertools.count(start) if stop is None else range(start, stop)
        for step in steps:
            with self._driver:
                if self._runs.stale(issued):
                    return
                began = perf_counter()
                self._watch.begin(step)
                try:
                    batch, _ = made_here(maker, step)
                finally:
                    self._watch.end()
                if stream is not None and reports is not None:
                    reports[step] = stream.report()
                self._busy += perf_counter() - began
            yield batch

    def _pull(self) -> tuple:
        """The maker's timings since the last pull, as a worker would send them (its CPU
        time: its busy time): read when the stats are."""
        busy, self._busy = self._busy, 0.0
        return (busy, busy, *self._maker.clock.take(busy))

    def close(self) -> None:
        """Ends the stall watch; what a maker holds open in this process is its loader's to
        close, once no thread reads it (``LoaderLifecycle._release``)."""
        self._watch.close()
