"""``loader.stats``: where the input pipeline's time goes, since the loader was made (or since
``reset_stats()``).

A training loop is input-bound when ``wait_fraction`` is large: the step waited for data.
``stages`` says which stage the time went to, added up over every process that made batches
(``jaxloader.base.timings`` names them); ``workers`` has each worker's share.

Example:
    >>> s = LoaderStats(batches=10, wait_s=0.1, run_s=0.9)
    >>> round(s.wait_fraction, 2)
    0.1
"""

from __future__ import annotations

import os
from types import MappingProxyType
from typing import Mapping, NamedTuple

from jaxloader.base.errors import ConfigError

_EMPTY: Mapping[str, float] = MappingProxyType({})


class WorkerStats(NamedTuple):
    """One worker process's work in the stats' window.

    Example:
        >>> import jaxloader as jl
        >>> w = jl.WorkerStats(worker=0, pid=123, batches=20, records=640, bytes=1 << 20,
        ...                    busy_s=1.5, cpu_s=1.4, stages={"read": 0.5, "collate": 1.0})
        >>> w.busy_s
        1.5
    """

    #: its index (``get_worker_info().id``)
    worker: int
    #: its process id
    pid: int
    #: batches it made (some may still wait to be handed out)
    batches: int
    #: records in those batches
    records: int
    #: bytes written into shared memory
    bytes: int
    #: seconds it spent on tasks (the rest it waited for one)
    busy_s: float
    #: CPU seconds of those tasks: ``busy_s - cpu_s`` is time spent waiting (reads)
    cpu_s: float
    #: seconds by stage (read, each transform, collate, slot wait)
    stages: Mapping[str, float]
    #: seconds it waited for a core (Linux's schedstat; 0 elsewhere): of ``busy_s - cpu_s``,
    #: the part that is no read waiting
    queued_s: float = 0.0
    #: seconds it was in use (``num_workers="auto"`` starts some late and parks others; None:
    #: not counted): its busy share is of this time, where shorter than the run's
    in_use_s: float | None = None


class LoaderStats(NamedTuple):
    """Counts and times since the loader was made (or since ``reset_stats()``).

    ``stages`` (seconds by stage, every process added up): ``"read"`` (the source's reads, its
    own decoding included), each transform by its repr (``"Map(decode)"``), ``"collate"``
    (records into the batch's buffer), ``"slot wait"`` (a worker waiting for a bigger slot),
    ``"hand-over"`` (the training process taking a worker's batch), ``"placement"``
    (``device_put``), ``"consumer wait"`` (inside ``next()``) and ``"step"`` (between
    ``next()`` calls). ``loader.diagnose()`` reads them.

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> loader = jl.DataLoader(jl.ArraySource({"x": np.arange(64)}), batch_size=4,
        ...                        process_index=0, process_count=1)
        >>> for batch in loader:
        ...     pass
        >>> stats = loader.stats
        >>> stats.batches, stats.records, "read" in stats.stages, 0 <= stats.wait_fraction <= 1
        (16, 64, True, True)
    """

    #: batches handed out
    batches: int
    #: seconds spent inside ``next()``: waiting for the loader
    wait_s: float
    #: seconds between one ``next()`` returning and the following ``next()`` call
    run_s: float
    #: from the first ``next()`` to the last batch handed out, less the time between runs
    #: (between passes, after a failed call): the loader's time in use
    wall_s: float = 0.0
    #: records in the batches made (by workers or in process): counted on the timed batches
    #: (the first 16 a process, then one in 16) and the rest taken at their mean size, so a
    #: short last batch not timed counts as a full one (1,008 records read for 1,000)
    records: int = 0
    #: bytes of the batches made (taken as ``records`` are)
    bytes: int = 0
    #: seconds by stage, every process added up (above)
    stages: Mapping[str, float] = _EMPTY
    #: each worker process's (``WorkerStats``)
    workers: tuple[WorkerStats, ...] = ()
    #: worker processes in use now (``num_workers="auto"`` changes it)
    num_workers: int = 0
    #: batches made and waiting, on average, when one was handed out
    ready_ahead: float = 0.0
    #: batches made, as reported: ahead of ``batches`` by those waiting (a worker's are
    #: counted as the training process reads them, with their batches)
    batches_made: int = 0
    #: from the first ``next()`` to its batch (the workers' start included)
    first_batch_s: float = 0.0
    #: when these counts began (``time.perf_counter()``: the loader made, or
    #: ``reset_stats()``), which tells a window's two reads apart from reads across a reset
    began: float = 0.0
    #: a window's stats (``since``): its batches all in its wall time
    window: bool = False
    #: CPU seconds of the training process, every thread, from the first batch handed out to
    #: the last (its step's host work, the loader's threads; batches made where no workers):
    #: the cores it used, which a step waiting for an accelerator does not (0: not measured)
    main_cpu_s: float = 0.0
    #: batches of a pass's first 32 steps, after its first, the loop waited for over twice the
    #: step before (and 10 ms): stalls, as the workers made their first tasks (or a task's
    #: batches coming at once: ``diagnose()`` counts none where the workers were busy 60% of
    #: the time or more)
    stalls: int = 0
    #: the seconds the loop waited for those batches
    stalled_s: float = 0.0

    @property
    def wait_fraction(self) -> float:
        """The share of the loop's time spent waiting for input (0 when nothing was timed),
        the first batch's wait included (the workers' start, a JitMap's compilation:
        ``diagnose()`` leaves it out; ``since()`` a read after it, a window, does too)."""
        total = self.wait_s + self.run_s
        return self.wait_s / total if total else 0.0

    @property
    def batches_per_s(self) -> float:
        """Batches handed out a second, after the first (whose wait includes the start)."""
        steady = self.wall_s - self.first_batch_s
        if self.batches > 1 and steady > 0 and not self.window:
            return (self.batches - 1) / steady
        return self.batches / self.wall_s if self.wall_s else 0.0

    @property
    def records_per_s(self) -> float:
        return self.batches_per_s * self.records / self.batches_made if self.batches_made else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.batches_per_s * self.bytes / self.batches_made if self.batches_made else 0.0

    @property
    def busy(self) -> tuple[float, ...]:
        """Each worker's busy fraction (0 to 1) of the time after the first batch (the first
        batch's wait is mostly the workers' start), or of its own time in use where shorter
        (``WorkerStats.in_use_s``: one autotune started late)."""
        steady = self.wall_s - self.first_batch_s
        if self.batches < 2 or steady <= 0:
            steady = self.wall_s
        return tuple(min(1.0, w.busy_s / min(steady, w.in_use_s or steady)) if steady else 0.0
                     for w in self.workers)

    def since(self, earlier: "LoaderStats") -> "LoaderStats":
        """The stats of the window from ``earlier`` (this loader's stats read before) to these:
        what the input did lately, which the totals of a long run hide. A worker started in the
        window counts whole; after a ``reset_stats()`` (counts gone back) these stats are the
        window.

        Example:
            >>> import jaxloader as jl
            >>> a = jl.LoaderStats(batches=10, wait_s=5.0, run_s=1.0, wall_s=6.0)
            >>> b = jl.LoaderStats(batches=110, wait_s=5.5, run_s=10.5, wall_s=16.0)
            >>> window = b.since(a)
            >>> window.batches, round(window.wait_fraction, 2), round(b.wait_fraction, 2)
            (100, 0.05, 0.34)
            >>> window.batches_per_s  # (100 batches in its 10 s)
            10.0
        """
        if not isinstance(earlier, LoaderStats):  # (a state_dict(), a step: AttributeError)
            raise ConfigError(f"LoaderStats.since(earlier): expected the LoaderStats read "
                              f"earlier from loader.stats, got {type(earlier).__name__} "
                              f"{earlier!r:.60}; read start = loader.stats, later "
                              "loader.stats.since(start) or loader.diagnose(since=start)")
        if self.began == earlier.began and self.batches < earlier.batches:
            raise ConfigError(f"LoaderStats.since(earlier): earlier holds {earlier.batches} "
                              f"batches, these {self.batches}: it was read later; call "
                              "later.since(earlier), or loader.diagnose(since=earlier)")
        if self.began != earlier.began:
            return self  # (read across a reset_stats(), or another loader's: the counts since)
        was = {(w.worker, w.pid): w for w in earlier.workers}
        workers = []
        for w in self.workers:
            e = was.get((w.worker, w.pid))
            workers.append(w if e is None or w.batches < e.batches else w._replace(
                batches=w.batches - e.batches, records=w.records - e.records,
                bytes=w.bytes - e.bytes, busy_s=w.busy_s - e.busy_s, cpu_s=w.cpu_s - e.cpu_s,
                stages=_minus(w.stages, e.stages), queued_s=max(0.0, w.queued_s - e.queued_s),
                in_use_s=None if w.in_use_s is None or e.in_use_s is None else max(
                    0.0, w.in_use_s - e.in_use_s)))
        batches = self.batches - earlier.batches
        ahead = (self.ready_ahead * self.batches - earlier.ready_ahead * earlier.batches)
        return LoaderStats(
            batches, self.wait_s - earlier.wait_s, self.run_s - earlier.run_s,
            self.wall_s - earlier.wall_s, self.records - earlier.records,
            self.bytes - earlier.bytes, _minus(self.stages, earlier.stages), tuple(workers),
            self.num_workers, max(0.0, ahead / batches) if batches else 0.0,
            self.batches_made - earlier.batches_made,
            self.first_batch_s if earlier.batches == 0 else 0.0, self.began,
            window=earlier.batches > 0, main_cpu_s=self.main_cpu_s - earlier.main_cpu_s,
            stalls=self.stalls - earlier.stalls, stalled_s=self.stalled_s - earlier.stalled_s)


def _minus(later: Mapping[str, float], earlier: Mapping[str, float]) -> Mapping[str, float]:
    """Seconds by stage between two reads (a stage's time only grows)."""
    return MappingProxyType({k: max(0.0, v - earlier.get(k, 0.0)) for k, v in later.items()})


def queued_s(pid: int) -> float:
    """Seconds the threads of process ``pid`` have waited for a core (runnable, not running:
    Linux's schedstat), so that a worker waiting for a CPU is not taken for one waiting on a
    read: every thread's, as its CPU time is (a JitMap's task waits off the CPU for XLA's
    threads, which wait for a core); 0 where it cannot be read."""
    try:
        threads = os.listdir(f"{_PROC}/{pid}/task")
    except OSError:
        return 0.0
    total = 0
    for thread in threads:
        try:
            with open(f"{_PROC}/{pid}/task/{thread}/schedstat", encoding="ascii") as f:
                total += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):  # (a thread that ended meanwhile)
            continue
    return total / 1e9


_PROC = "/proc"
