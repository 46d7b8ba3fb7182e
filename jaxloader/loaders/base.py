"""``LoaderLifecycle``: what every loader does the same way around its iterators.

::

    DataLoader, StreamLoader ── _progress (iterator.Progress), _engine (what makes batches),
                                _active (the live iterator's work)
       step, stats, worker_pids; _invalidate() on iter/restore/close; close() and `with`;
       save()/load() for Orbax v1 (a JSON file of state_dict() per process)

A subclass gives ``state_dict``/``load_state_dict`` and how it iterates.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import itertools
import os
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol, Self, cast

from jaxloader.base.checks import Int
from jaxloader.base.errors import ConfigError, JaxloaderWarning, user_stacklevel
from jaxloader.base.interrupts import run_all
from jaxloader.base.stats import LoaderStats
from jaxloader.engines.in_process import Engine, InProcessEngine, Maker
from jaxloader.loaders import not_pickled, open_pools
from jaxloader.loaders.iterator import IteratorWork, Progress
from jaxloader.loaders.monitor import AutoTune, Monitor
from jaxloader.loaders.orbax_v1 import OrbaxV1
from jaxloader.loaders.options import (LoaderOptions, Placement, check_jax_placement,
                                      check_worker_init_fn)
from jaxloader.runtime.descriptors import out_of_descriptors
from jaxloader.runtime.worker_info import get_worker_info

if TYPE_CHECKING:
    from jaxloader.loaders.diagnosis import Diagnosis
    from jaxloader.sharding.put import Putter


class Workers(Protocol):
    """Workers elsewhere, for ``workers=``: ``jaxloader.ray.RayWorkers``."""

    n: int  # how many (a stream's readers are spread over them)

    def engine(self, maker: Maker, stall_warning_s: float | None, label: str) -> Engine: ...


_MADE: dict[str, Iterator[int]] = collections.defaultdict(lambda: itertools.count(1))


def _weakly(method: Callable[[], str]) -> Callable[[], str]:
    """``method`` called through a weak reference to its object (``""`` once it is gone): for
    what its loader holds (the monitor), so that no cycle keeps a dropped loader, and its
    workers, until the cycle collector runs."""
    ref = weakref.WeakMethod(method)

    def call() -> str:
        bound = ref()
        return "" if bound is None else bound()
    return call


def label(kind: str, source: Any, batch_size: int) -> str:
    """A loader's name in log lines, which may come from several loaders of one process (a
    train and an eval loader): its kind and number in this process, what it reads."""
    return f"{kind} {next(_MADE[kind])} ({type(source).__name__}, batch_size {batch_size})"


class LoaderLifecycle(not_pickled.NotPickled, OrbaxV1):
    """Position, statistics, Orbax v1 hooks and shutdown, shared by the loaders."""

    _progress: Progress
    _active: IteratorWork | None  # (the live iterator's work: not the iterator, iterator.py)
    _engine: Engine
    _options: LoaderOptions
    _placement: Placement
    _jax_pending: tuple[bool, bool]  # the place's numbers taken without JAX (options.jax_pending)
    _monitor: Monitor | None
    _putter: Putter | None  # (_putter_for's: None without a sharding)
    _summarised: LoaderStats | None = None  # the stats at the periodic summary before
    _probing = False  # iter() by jaxloader.profile, which puts the position back: not compared
    # with the other processes' (sharding.hosts), as it may run on one of them alone

    def _putter_for(self, sharding: Any, given_index: Int | None,
                    by_block: bool = False, mask: str | None = None) -> "Putter | None":
        """The placement of ``sharding`` (``None``: batches stay NumPy). ``by_block`` (a
        stream's): with several processes, this process's place is the block of the global
        batch its devices hold (``Putter.block``); a ``process_index`` given that the sharding
        places elsewhere is refused. (A ``DataLoader`` reads the rows they hold,
        ``Putter.rows``: a ``process_index`` given must be JAX's.) ``mask``: the pad mask's
        key the batches hold, which a dict of shardings must name (as made, not at the first
        batch's placement)."""
        if sharding is None:
            return None
        if mask is not None and isinstance(sharding, dict) and mask not in sharding:
            raise ConfigError(
                f"sharding: a dict of shardings of keys {sorted(map(str, sharding))} without "
                f"{mask!r}, the pad mask's leaf each batch holds (last_batch='pad', or a "
                f"StreamLoader's num_epochs=): add {mask!r}: a sharding of the batch axis "
                "(jaxloader.data_sharding(mesh)), or pass one sharding for every leaf")
        from jaxloader.sharding.given import local_only
        from jaxloader.sharding.process_place import process_place
        from jaxloader.sharding.put import Putter

        batch_size, index, count = self._placement
        import jax

        if count != jax.process_count() and not (count == 1 and local_only(sharding)):
            raise ConfigError(
                f"sharding= with process_count={count}, where JAX runs {jax.process_count()} "
                "process(es) (jax.process_count()): a sharded batch is one global jax.Array "
                "over JAX's processes; leave process_index and process_count unset (JAX's "
                "own), or drop sharding= and place each process's NumPy batch yourself")
        putter = Putter(sharding, count, batch_size)
        block = process_place(putter, index, given_index, by_block=by_block)
        if block != index:
            self._placement = self._placement._replace(process_index=block)
        return putter

    def _check_placement(self) -> None:
        """At ``iter()``, ``peek()`` and the state's calls: a place taken while JAX was not
        imported, against JAX's now."""
        self._jax_pending = check_jax_placement(self._placement, self._jax_pending)

    def _start_engine(self, maker: Maker, worker_init_fn: Callable[[int], object] | None,
                      workers: Workers | None = None) -> Engine:
        """The engine of ``maker``'s batches: in this process, worker processes, or
        ``workers``' (an object whose ``engine(maker)`` gives one: ``jaxloader.ray``)."""
        options = self._options
        engine: Engine
        tune = None
        check_worker_init_fn(worker_init_fn)
        if workers is not None:  # (prefetch=8, start_method='fork' were taken, to no effect)
            if not callable(getattr(workers, "engine", None)) or options.num_workers or \
                    options.auto_workers or worker_init_fn is not None or options.timeout_s \
                    is not None or options.auto_prefetch or options.prefetch != 2 or \
                    options.start_method != "exec":
                raise ConfigError(
                    f"workers={workers!r:.60}: expected jaxloader.ray.RayWorkers(n), with "
                    "num_workers=0, no worker_init_fn, timeout_s, prefetch or start_method (the "
                    "actors are the workers: their environment is RayWorkers(n, runtime_env=...), "
                    "their tasks ahead RayWorkers(n, in_flight=...), a hung one's timeout "
                    "RayWorkers(n, timeout_s=...); Ray starts their processes)")
            engine = workers.engine(maker, options.stall_warning_s, self._progress.label)
        elif options.auto_prefetch and not options.auto_workers:
            raise ConfigError(
                f"prefetch='auto' with num_workers={options.num_workers}: the tuning that "
                "doubles the prefetch runs with num_workers='auto' only; pass "
                "num_workers='auto', or prefetch as a count (2 by default)")
        elif options.num_workers == 0:
            if options.timeout_s is not None:  # (taken without a word: a blocked source
                warnings.warn(  # waited for good)
                    f"timeout_s={options.timeout_s}: with num_workers=0 a batch is made in the "
                    "thread that asks for it, which nothing can stop while the source blocks, "
                    "so no batch is timed out (stall_warning_s reports a late one only with "
                    "sharding=, whose thread makes it); use workers to time batches out, or a "
                    "source that times out its own reads", JaxloaderWarning,
                    stacklevel=user_stacklevel())
            ignored = [name for name, given in (
                ("worker_init_fn", worker_init_fn is not None),
                (f"prefetch={options.prefetch}", options.prefetch != 2),
                (f"start_method={options.start_method!r}", options.start_method != "exec"))
                if given and not options.auto_workers]  # (taken without a word, as PyTorch
            if ignored:  # does: a worker_init_fn's setup, a connection, never ran)
                warnings.warn(
                    f"{', '.join(ignored)}: with num_workers=0 no worker process starts, so "
                    "this acts on nothing (batches are made in this process); "
                    + ("call the function once here if this process needs its setup, or "
                       if worker_init_fn is not None else "") + "pass num_workers=1 or more",
                    JaxloaderWarning, stacklevel=user_stacklevel())
            engine = InProcessEngine(maker, options.stall_warning_s, self._progress.label)
        elif get_worker_info() is not None:
            self._made_in_a_worker()
            engine = InProcessEngine(maker, options.stall_warning_s, self._progress.label)
        else:
            from jaxloader.workers.pool import WorkerPool
            from jaxloader.workers.launch import hold_standard_descriptors
            from jaxloader.sharding.pinning import pinner_for

            hold_standard_descriptors()
            capacity = None
            if options.auto_workers:
                tune = AutoTune(None, tune_prefetch=options.auto_prefetch,
                                counts=self._worker_counts())
                capacity = tune.capacity()
            try:
                engine = WorkerPool(maker, options.num_workers, prefetch=options.prefetch,
                                    start_method=options.start_method,
                                    worker_init_fn=worker_init_fn,
                                    stall_warning_s=options.stall_warning_s,
                                    timeout_s=options.timeout_s, max_workers=capacity,
                                    label=self._progress.label, pinner=pinner_for(
                                        self._putter, self._progress.label))
            except OSError as e:  # (a pipe, a worker's status file: a bare "Errno 24")
                if e.errno != errno.EMFILE:
                    raise
                raise out_of_descriptors(e, f"the {options.num_workers} workers' pipes "
                                                "and status files") from e
            if tune is not None:
                tune.pool = engine
            open_pools.started(self._progress.label, engine)
        self._monitor = None
        if tune is not None or options.log_every_s:
            self._monitor = Monitor(tune, options.log_every_s, _weakly(self._summary),
                                    self._progress.label)
        return engine

    def _made_in_a_worker(self) -> None:
        """In another loader's worker (or Ray actor) a loader makes its batches in process,
        untuned, with a warning (the same batches): a transform's module that makes a loader
        at its top level is imported by each worker, whose loader started workers that
        imported it again, without end."""
        info, options = get_worker_info(), self._options
        assert info is not None
        count = "'auto'" if options.auto_workers else options.num_workers
        self._options = dataclasses.replace(options, auto_workers=False,
                                            auto_prefetch=False)  # (no count to tune)
        warnings.warn(
            f"a {type(self).__name__} with num_workers={count} was made in "
            f"worker {info.id} (pid {os.getpid()}) of another loader: it makes its batches "
            "in this process, the same batches (a worker starts no workers). A loader made "
            "at a module's top level is made again in each worker that imports the module "
            "(for a transform defined there): make it in a function that the training "
            "script calls", JaxloaderWarning, stacklevel=4)

    def _worker_counts(self) -> list[int] | None:
        """The worker counts ``num_workers="auto"`` may choose among (None: any)."""
        return None

    def __repr__(self) -> str:
        """What it reads, how, and where it is (see ``_reads``)."""
        place = "" if self.process_count == 1 else \
            f", process {self.process_index} of {self.process_count}"
        return (f"{type(self).__name__}({self._reads()}, batch_size={self.batch_size}{place}, "
                f"num_workers={self.num_workers}, step={self.step}"
                f"{', closed' if self._progress.closed else ''})")

    def _reads(self) -> str:
        """The source (or stream) and its size, for ``repr``."""
        raise NotImplementedError

    def _summary(self) -> str:
        """The periodic one-line summary (``log_every_s=``): the window since the summary
        before, whose verdict is the input's now (the totals' would name a slow first epoch
        for the rest of the run), then the batches since the stats began."""
        total = self.stats
        before, self._summarised = self._summarised, total
        stats = total.since(before) if before is not None else total
        line = (f"{stats.batches} batches in {stats.wall_s:.{0 if stats.wall_s >= 10 else 1}f} s, "
                f"{stats.batches_per_s:.1f} "
                f"batches/s, the loop waited {stats.wait_fraction:.0%}, "
                f"{self.num_workers} worker(s)")
        if stats.busy:
            line += f" busy {sum(stats.busy) / len(stats.busy):.0%}"
        if stats.batches >= 2:
            verdict = self._diagnose(stats)
            line += f"; bottleneck: {verdict.bottleneck}"
            if verdict.advice:
                line += f" ({verdict.advice[0]})"
        return line + f" ({total.batches} batches since the stats began)"

    @property
    def batch_size(self) -> int:
        """Records per batch in this process."""
        return self._placement.batch_size

    @property
    def process_index(self) -> int:
        """This process's place among the processes sharing the global batch (a
        ``StreamLoader`` with a ``sharding``: the block of it this process's devices hold)."""
        return self._placement.process_index

    @property
    def process_count(self) -> int:
        """Processes sharing the global batch (``batch_size * process_count`` records)."""
        return self._placement.process_count

    @property
    def num_workers(self) -> int:
        """Worker processes in use now (``num_workers="auto"`` changes it as it runs)."""
        return self._engine.active

    @property
    def num_epochs(self) -> int | None:
        """Epochs per ``iter(loader)``, or ``None`` for endless."""
        return self._options.num_epochs

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the worker processes (empty with ``num_workers=0``, and once the
        loader is closed: its workers' pids may be other processes' then)."""
        return [] if self._progress.closed else self._engine.pids

    @property
    def step(self) -> int:
        """The global step of the next batch this loader hands out."""
        return self._progress.step

    @property
    def stats(self) -> LoaderStats:
        """Batches handed out, the time waited inside ``next()`` and run between calls, and
        where the time went: seconds by stage, rates, each worker's share (``LoaderStats``)."""
        engine = self._engine
        pids = getattr(engine, "maker_pids", None) or engine.pids  # (a Ray engine's by index)
        return self._progress.stats(engine.gauges, pids, engine.active,
                                    local=not getattr(engine, "remote", False))

    def _local_pids(self) -> list[int]:
        """The workers' processes on this machine (none for Ray actors)."""
        return [] if getattr(self._engine, "remote", False) else list(self._engine.pids)

    def diagnose(self, since: LoaderStats | None = None) -> Diagnosis:
        """What limits the input now, from ``stats``: ``bottleneck`` (``"step"``,
        ``"workers"``, ``"source"``, ``"main"`` or ``"device"``), seconds by stage, and advice;
        ``print()`` it for a table. ``since``: stats read before (``loader.stats``), to judge
        only the window after them (``stats.since(earlier)``).

        Example:
            >>> import numpy as np, jaxloader as jl
            >>> loader = jl.DataLoader(jl.ArraySource({"x": np.ones((2048, 256))}), batch_size=64,
            ...                        transforms=[jl.Map(lambda r: {"x": np.sort(r["x"])})],
            ...                        process_index=0, process_count=1)
            >>> for batch in loader:
            ...     pass
            >>> loader.diagnose().bottleneck  # made in this process, for a loop doing nothing
            'main'
        """
        stats = self.stats
        return self._diagnose(stats if since is None else stats.since(since))

    def _diagnose(self, stats: LoaderStats) -> Diagnosis:
        from jaxloader.loaders.diagnosis import diagnose, mapped_functions

        put = self._putter
        return diagnose(stats, self._engine.active, counts=self._worker_counts(),
                        remote=getattr(self._engine, "remote", False),
                        actor_cpus=getattr(self._engine, "actor_cpus", None),
                        placed_in_thread=put is None or put.single_device,
                        read_threads=getattr(getattr(self, "_maker", None), "threaded_reads",
                                             None), mapped=mapped_functions(
                                                 getattr(self, "_source", None)),
                        endless=self.num_epochs is None)

    def reset_stats(self) -> None:
        """Starts the counts and timings again (e.g. after a warm-up)."""
        self._progress.reset_stats(self._local_pids())
        self._engine.gauges.reset()
        self._summarised = None  # (the periodic summary's window starts afresh too)
        if self._monitor is not None:  # (a tuning window across the reset: counts gone back)
            self._monitor.restart()

    def _invalidate(self, until_gone: bool = True) -> bool:
        """Makes live iterators stale and stops what they run (thread, engine run), waiting
        for the device-prefetch thread until it is gone: a new run must not start beside it
        (an in-process engine's reader or cache is not for two threads at once). ``close()``
        waits at most the join timeout instead; whether nothing runs any more."""
        self._progress.generation += 1
        gone = True
        if self._active is not None:
            gone = self._active.stop(until_gone)
            self._active = None
        return gone

    @property
    def device_prefetch(self) -> int:
        """Batches kept ready on device ahead of the consumer (2 where not given)."""
        return cast(int, self._options.device_prefetch)

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    # -- shutdown ---------------------------------------------------------------------------
    def close(self) -> None:
        """Releases workers and buffers, without waiting for batches in flight (workers busy
        in a transform are killed); idempotent."""
        self._progress.closed = True
        open_pools.closed(self._engine)  # (its workers end: not counted among those open)
        gone: list[bool] = []
        # Every call runs every step (each is idempotent): a Ctrl-C while the prefetch thread
        # is joined must not skip the workers (``jaxloader.base.interrupts``, 4), and one that lands
        # before the steps began (as ``run_all`` starts) leaves them to the next close().
        run_all([lambda: self._progress.keep_queued(self._local_pids()),  # (before they end)
                 lambda: gone.append(self._invalidate(until_gone=False)), self._engine.close,
                 lambda: self._release(bool(gone) and gone[0])])

    def _release(self, idle: bool) -> None:
        """What a loader frees once its engine is closed (``idle``: no thread of it still
        makes a batch in this process)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
