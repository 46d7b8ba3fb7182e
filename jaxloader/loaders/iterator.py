"""``LoaderIterator``: hands out a run of batches and moves the loader's position.

::

    DataLoader ── Progress (owned by the loader, shared with its iterators):
       │            step (next global step to hand out), generation, broken, closed, stats
       └ iter() ─> LoaderIterator(progress, generation, start, stop, engine, put, depth)
                      engine.batches(start, stop) [─> DevicePrefetcher(put, depth)] ─> next()

An iterator is valid while ``progress.generation`` is the one it was made with: ``iter()``,
``load_state_dict()`` and ``close()`` start a new generation. The step moves when a batch is
handed out, never earlier, so a state taken between two ``next()`` calls names the next batch the
user would see. What an interrupt inside ``next()`` may and may not do is written down in
``jaxloader.base.interrupts``. Example: ``LoaderIterator``'s.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Callable, Generator, Generic, Protocol, Sequence

from typing_extensions import TypeVar

from jaxloader.base.errors import JaxloaderError, WorkerError, again, kept
from jaxloader.base.batch_kinds import BatchKinds
from jaxloader.base.stats import LoaderStats, WorkerStats, queued_s
from jaxloader.base.timings import HANDOVER, PLACE, STEP, WAIT, Gauges
from jaxloader.loaders.foreign_arguments import GrainAttributes
from jaxloader.sharding.hosts import HostsCheck
from jaxloader.sharding.prefetch import DevicePrefetcher, Stopped

log = logging.getLogger("jaxloader")
SLOW_FIRST_S = 1.0  # a first batch slower than this is logged


class BatchRuns(Protocol):
    """Batches of steps ``start``, ``start + 1``, ... up to ``stop`` (an engine, or a stream
    loader's runs over its engine): what an iterator runs."""

    def batches(self, start: int, stop: int | None) -> Generator[Any, None, None]: ...


class Progress:
    """Where a loader is, whether it can go on, and how long its consumer waited."""

    def __init__(self, owner: str = "DataLoader",
                 where: Callable[[int], str] = "step {}".format) -> None:
        self.owner = owner  # the loader's class, for messages
        self.label = owner  # which loader, in log lines (``base.label``: its number, source)
        self.where = where  # a step named in messages (its epoch, its records)
        self.kinds = BatchKinds()  # every batch's leaves as the first's
        self.step = 0  # the global step of the next batch handed out
        self.generation = 0  # iterators of older generations are stale
        self.broken: JaxloaderError | None = None  # raised by every later call
        self.closed = False
        self.at_pass_end = ""  # restored at a pass's end: the pass its next iter() begins
        self.passes_said = False  # a second pass of several epochs begun by iter(), said
        self.queued_seen: dict[int, float] = {}  # (keep_queued's: a process's last read)
        self.reset_stats()

    def check(self) -> None:  # the loader's failure, or that it is closed, raised
        if self.broken is not None:
            raise again(self.broken)
        if self.closed:
            raise JaxloaderError(f"{self.owner} is closed; create a new one to iterate again")

    def stats(self, gauges: Gauges, pids: list[int], num_workers: int,
              local: bool = True) -> LoaderStats:
        """The stats of the consumer's side with the engine's ``gauges`` (``LoaderStats``);
        ``pids``: the makers', in order; ``local``: this machine's (/proc read here)."""
        stages: dict[str, float] = {}
        workers, made, records, nbytes = [], 0, 0, 0
        for i, totals in enumerate(gauges.makers):
            mine = totals.stages()
            for stage, spent in mine.items():
                stages[stage] = stages.get(stage, 0.0) + spent
            made, records, nbytes = (made + totals.batches, records + totals.records,
                                     nbytes + totals.bytes)
            if pids:  # (a remote maker's time waiting for a core: sent with its tasks)
                pid = pids[i] if i < len(pids) else 0
                queued = min(max(0.0, self.keep_queued([pid]) - self.queued_from.get(pid, 0.0)
                                 if local else totals.queued_s) if pid else 0.0,
                             max(0.0, totals.busy_s - totals.cpu_s))
                # (at most the tasks' time off their CPU: waits outside tasks are not theirs)
                workers.append(WorkerStats(i, pid, totals.batches, totals.records, totals.bytes,
                                           totals.busy_s, totals.cpu_s, mine, queued,
                                           gauges.in_use_s(i)))
        if gauges.receipt_w or gauges.handouts:
            stages[HANDOVER] = gauges.hand_over_s(self.batches)
        if self.place_s:
            stages[PLACE] = self.place_s
        stages[WAIT], stages[STEP] = self.wait_s, self.run_s
        wall = self.last_s - self.first_s - self.apart_s if self.first_s is not None else 0.0
        return LoaderStats(self.batches, self.wait_s, self.run_s, wall, records, nbytes,
                           stages, tuple(workers), num_workers, gauges.ready_ahead(), made,
                           self.first_batch_s, self.began, main_cpu_s=self.cpu_s,
                           stalls=self.stalls, stalled_s=self.stalled_s)

    def keep_queued(self, pids: Sequence[int]) -> float:
        """Reads the time the processes ``pids`` have waited for a core, kept for when they
        are gone (stats after ``close()`` read 0 from their ended processes); the last's."""
        found = 0.0
        for pid in pids:
            found = self.queued_seen[pid] = max(queued_s(pid), self.queued_seen.get(pid, 0.0))
        return found

    def reset_stats(self, pids: Sequence[int] = ()) -> None:
        """Starts the counts again (the engine's gauges are reset by the loader); ``pids``:
        the workers', whose time waiting for a core counts from now."""
        self.queued_from = {pid: self.keep_queued([pid]) for pid in pids}
        self.began = time.perf_counter()  # when the stats began (LoaderStats.began)
        self.batches = self.stalls = 0  # handed out (stalls: long waits); time in next(), run
        self.wait_s = self.run_s = self.place_s = self.stalled_s = 0.0  # between, device_put's
        self.cpu_s = 0.0  # the training process's CPU seconds over the runs (LoaderStats)
        self.first_s: float | None = None  # when the first next() of the window was entered
        self.last_s = 0.0  # when the last batch was handed out
        self.apart_s = 0.0  # between runs (an evaluation between passes): no one's, not wall
        self.first_batch_s = 0.0  # how long the first batch of the window took
        self.check_at = 0.0  # when next() next looks at the first batch and the monitor


BatchT = TypeVar("BatchT", default=Any)
"""A loader's batch: a pytree (dicts, tuples, lists) of ``np.ndarray``, or of ``jax.Array`` with
``sharding=``. ``Any`` unless the code says which, as JAX's own pytrees are (a union of array
and containers would make ``batch["image"] * 2`` a type error): ``loader:
jl.DataLoader[dict[str, np.ndarray]] = jl.DataLoader(...)`` types ``next()``, ``peek()`` and
the ``for`` loop's batch."""


class LoaderIterator(GrainAttributes, Generic[BatchT]):
    """Yields batches from a start step; valid until the next ``iter()``, restore or close.

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> loader = jl.DataLoader(jl.ArraySource({"x": np.arange(6)}), batch_size=2,
        ...                        process_index=0, process_count=1)
        >>> it = iter(loader)  # a LoaderIterator
        >>> next(it)["x"].tolist(), loader.step, it
        ([0, 1], 1, LoaderIterator(DataLoader, next step 1, ends before step 3))
        >>> [b["x"].tolist() for b in it]
        [[2, 3], [4, 5]]
    """

    def __init__(self, progress: Progress, start: int, stop: int | None, engine: BatchRuns,
                 put: Callable[[Any], Any] | None, device_prefetch: int,
                 single_device: bool, ends_before: Callable[[int], bool] | None = None,
                 monitor: Any = None, hosts: HostsCheck | None = None,
                 failed: Callable[[BaseException, int], None] | None = None,
                 epochs: tuple[int, Callable[[], None]] | None = None) -> None:
        self._progress = progress
        self._generation, self._step, self._start_step = progress.generation, start, start
        self._stop, self._engine, self._put = stop, engine, put
        self._depth, self._single_device = device_prefetch, single_device
        self._ends_before = ends_before  # whether the run ends before a step (a stream's pass)
        self._monitor = monitor  # loaders/monitor: autotune, periodic summary (or None)
        self._hosts = hosts  # the other processes' settings, until compared (sharding.hosts)
        self._failed = failed  # tells the other processes a batch failed (pass_votes)
        # (steps an epoch, a check of the source at each epoch's first step: a source that
        # grew under an endless loader is refused there, as at iter(); else never read)
        self._epochs, self._next_epoch = epochs, math.inf
        if epochs is not None:
            self._next_epoch = (start // epochs[0] + 1) * epochs[0]
        self.work = IteratorWork()  # (what its loader holds of it, to stop)
        # When the last batch was handed out, once _checks has started the consumer's time
        # (on the first call, and again after a call that failed: the time until the next
        # call is not the consumer's). next() tests one value, check_at, for all of it.
        self._last_return, self._last_cpu = 0.0, 0.0  # (and the process's CPU time then)
        self._timing = False
        progress.check_at = 0.0
        self._interrupted = True  # no work under way yet: _start() (or the first next()) starts it

    def _start(self) -> "LoaderIterator[BatchT]":
        """Starts the engine run (and the device-prefetch thread). Called by the loader once it
        holds this iterator: a Ctrl-C after the thread starts must leave it to the loader to
        stop (``jaxloader.base.interrupts``, 3), or it would drive the engine beside the next run."""
        self._start_work()
        return self

    def _start_work(self) -> None:
        """The engine run (and device prefetch) from this iterator's step."""
        self.work.batches = batches = self._engine.batches(self._step, self._stop)
        put = self._put
        if put is not None:
            put = _timed_put(put, self._progress, self._step)
        if put is None:
            self._next: Callable[[], Any] = batches.__next__
        elif self._depth == 0:
            self._next = lambda: put(next(batches))
        else:
            self.work.prefetcher = prefetcher = DevicePrefetcher(
                batches, put, self._depth, put_in_thread=self._single_device)
            self._next = prefetcher.next
            prefetcher.start()  # held before it runs: an interrupt cannot orphan it
        self._interrupted = False

    _caller: int | None = None  # the thread in next(), while one is

    def __iter__(self) -> "LoaderIterator[BatchT]":
        return self

    def __repr__(self) -> str:
        p, stop = self._progress, "" if self._stop is None else f", ends before step {self._stop}"
        return f"LoaderIterator({p.owner}, " + (
            "broken" if p.broken else "closed" if p.closed else "stale: a later iter() or "
            "restore of its loader" if p.generation != self._generation else
            f"next step {self._step}{stop}") + ")"

    # Orbax v1 takes an object with save/load as a StatefulCheckpointable: an iterator given
    # for the loader (Grain's idiom) is refused with the remedy, as the classic API refuses it
    async def save(self, directory: Any) -> Any:
        """Refused: Orbax saves the loader itself (``{"loader": loader}``)."""
        from jaxloader.loaders.state_files import check_loader

        check_loader(self, "ocp_v1 save of a checkpointable")

    async def load(self, directory: Any) -> Any:
        """Refused: Orbax restores into the loader itself."""
        from jaxloader.loaders.state_files import check_loader

        check_loader(self, "ocp_v1 load of a checkpointable", "load_state_dict")

    def __next__(self) -> BatchT:
        me, caller = threading.get_ident(), self._caller
        if caller is not None and caller != me:  # (a generator's "already executing", and
            raise JaxloaderError(  # the other thread's batch dropped with it)
                f"next() on this {self._progress.owner} iterator from two threads at once; one "
                "thread takes a loader's batches (its workers make them in parallel already): "
                "hand them to other threads through a queue, or give each thread its own "
                "loader (Keras' PyDataset(workers=N) calls from several: leave workers at 1)")
        self._caller = me  # (inline, no wrapper: a call's return would be a point where a
        try:  # signal could split the step from its batch)
            entered = time.perf_counter()
            progress = self._progress
            if progress.broken is not None:
                raise again(progress.broken)
            if progress.generation != self._generation:
                progress.check()
                raise JaxloaderError(
                    "this iterator is stale: iter(), load_state_dict() (jl.profile(loader) too) "
                    f"or close() was called on its {progress.owner} since it was made; call "
                    f"iter(loader) again (one live iterator a loader: make two {progress.owner}s)"
                )
            if self._hosts is not None:  # (before a stream's end, which runs a collective)
                if self._hosts.due(self._step - self._start_step,
                                   lambda: progress.generation != self._generation):
                    self._hosts = None  # every other process's settings compared, alike
                if progress.generation != self._generation:  # (closed or restored meanwhile)
                    return self.__next__()  # (says so)
                entered = time.perf_counter()  # (a wait for the other hosts is not the input's)
            if self._stop is not None and self._step >= self._stop:
                raise StopIteration
            try:
                ends = self._ends_before is not None and self._ends_before(self._step)
            except Stopped:  # (a stream's pass: closed or restored from another thread meanwhile)
                return self.__next__()  # (says so)
            if ends:
                self._stop = self._step  # asked once: the same answer on every later call
                self.stop_work()  # what was made past the end goes
                raise StopIteration
            if self._step >= self._next_epoch and self._epochs is not None:
                self._epochs[1]()  # (raises, again at each call, if the source changed)
                self._next_epoch += self._epochs[0]
            if self._interrupted:
                # Until the old thread is gone (the first try may itself have been cut short):
                # two threads must never drive the engine at once.
                self.stop_work(until_gone=True)
                self._start_work()
            try:
                batch = self._next()
                progress.kinds.check(batch, self._step, progress.where)
                # (the process's CPU time too: a step's, not its wall time, holds a core)
                returned, cpu = time.perf_counter(), time.process_time()
                if returned >= progress.check_at:  # a first batch, or the monitor's time
                    self._checks(progress, entered, returned, cpu)
            except WorkerError as e:
                progress.broken = kept(e)
                if self._failed is not None:
                    self._failed(e, self._step)
                raise
            except StopIteration:
                if progress.generation != self._generation:  # (its run ended by a restore, iter()
                    return self.__next__()  # or close() from elsewhere: says it is stale, not done)
                raise
            except BaseException as e:
                # Ctrl-C, or a transform's error with num_workers=0: whatever was in flight is
                # dropped, and the next call makes this same step again
                # (jaxloader.base.interrupts, 1).
                self._interrupted = True
                self._timing = False
                progress.check_at = 0.0  # (next() then starts the consumer's time again)
                self.stop_work()
                if isinstance(e, Stopped):  # (closed or restored from another thread meanwhile)
                    return self.__next__()  # (says so)
                if self._failed is not None and isinstance(e, Exception):  # (not a Ctrl-C: the
                    self._failed(e, self._step)  # step is made again at the next call)
                raise
            # No calls from here to the return: a signal cannot split the step from its batch, nor
            # another thread's iter(), load_state_dict() or close() come between this test and the
            # step (it set the step, and this iterator's batch undid it)
            if progress.generation != self._generation:
                return self.__next__()  # (says that this iterator is stale; the batch goes)
            progress.step = self._step = self._step + 1
            progress.wait_s += (waited := returned - entered)
            ran, progress.batches = entered - self._last_return, progress.batches + 1
            if waited > 0.01 and waited > 2 * ran and 1 < self._step - self._start_step <= 32:
                progress.stalls, progress.stalled_s = progress.stalls + 1, progress.stalled_s + waited
            progress.run_s += ran  # (a stall above: 10 ms, twice the step, as a pass starts)
            progress.last_s = self._last_return = returned
            progress.cpu_s, self._last_cpu = progress.cpu_s + cpu - self._last_cpu, cpu
            self._caller = None  # (no call: a signal cannot come before the return)
            return batch
        except BaseException:
            self._caller = None
            raise

    def _checks(self, progress: Progress, entered: float, returned: float, cpu: float) -> None:
        """The first batch of the stats' window (said if slow), the consumer's time started
        (the first call, or one after a failed call), and the monitor's turn."""
        monitor = self._monitor
        if not self._timing:
            self._last_return, self._timing = entered, True  # (no run time before this call)
            self._last_cpu = cpu
            if progress.first_s is not None:  # (not the window's first run)
                progress.apart_s += max(0.0, entered - progress.last_s)
            if monitor is not None:
                monitor.restart()
        if progress.first_s is None:  # (the window's first call: none of its run time before)
            self._last_return, self._last_cpu = entered, cpu
            progress.first_s, progress.first_batch_s = entered, returned - entered
            progress.queued_from = {}  # (the workers' time queued for a core counts from
            # their first batch of the window, as its time does: their start, on every core,
            # not; a worker started since, after a Ctrl-C or by autotune, from the next check)
            if returned - entered > SLOW_FIRST_S:
                log.info("%s: the first batch took %.1f s (the first reads, and the workers' "
                         "start where it has workers)", progress.label, returned - entered)
        for pid in getattr(self._engine, "pids", ()):
            if pid not in progress.queued_from:
                progress.queued_from[pid] = progress.keep_queued([pid])
        if monitor is not None and returned >= monitor.next_at:
            monitor.tick(returned, self._step + 1, progress.batches + 1,
                         progress.wait_s + (returned - entered))
        progress.check_at = monitor.next_at if monitor is not None else math.inf

    def stop_work(self, until_gone: bool = False) -> bool:
        """``IteratorWork.stop``: its engine run (and device-prefetch thread) stopped."""
        return self.work.stop(until_gone)


class IteratorWork:
    """What an iterator runs: its engine run (``batches``) and device-prefetch thread, which
    its loader holds to stop at the next ``iter()``, restore or ``close()``. The loader holds
    this, not the iterator: a ``StreamLoader``'s iterator holds its loader (its runs start
    from the loader's filed states), and the loader holding it back made a cycle: a
    ``StreamLoader`` dropped once it had made an iterator (a notebook's cell run again) kept
    its workers until Python's cycle collector ran.

    Example:
        >>> IteratorWork().stop()  # (nothing started)
        True
    """

    __slots__ = ("batches", "prefetcher")

    def __init__(self) -> None:
        self.batches: Generator[Any, None, None] | None = None
        self.prefetcher: DevicePrefetcher | None = None

    def stop(self, until_gone: bool = False) -> bool:
        """Stops the host-batch thread (waiting for it at most its join timeout, or
        ``until_gone``) or closes the engine run (frees its slots); whether nothing of it
        runs any more (a thread still finishing a batch: not yet)."""
        if self.prefetcher is not None:
            return self.prefetcher.close(until_gone)
        if self.batches is not None:
            try:
                self.batches.close()
            except ValueError:  # run by another thread now: the engine's close() ends it
                return False
        return True


def _timed_put(put: Callable[[Any], Any], progress: Progress,
               start: int) -> Callable[[Any], Any]:
    """``put`` adding its seconds to the loader's placement time (whichever thread runs it);
    its error of a batch (a leaf JAX would wrap) names the step, from ``start`` in order."""
    steps = iter(range(start, 1 << 62))

    def timed(batch: Any) -> Any:
        began, step = time.perf_counter(), next(steps)
        try:
            placed = put(batch)
        except JaxloaderError as e:
            e.args = (f"step {step}: {e}",) if len(e.args) == 1 else e.args
            raise
        progress.place_s += time.perf_counter() - began
        return placed
    return timed
