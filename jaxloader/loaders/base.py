"""``LoaderLifecycle``: what every loader does the same way around its iterators.

::

    DataLoader, StreamLoader ── _progress (iterator.Progress), _active (the live iterator),
                                _engine (what makes batches)
       step, stats, worker_pids; _invalidate() on iter/restore/close; close() and `with`;
       save()/load() for Orbax v1 (a JSON file of state_dict() per process)

A subclass gives ``state_dict``/``load_state_dict`` and how it iterates.
"""

from __future__ import annotations

from typing import Any, Callable, Self

from jaxloader.base.interrupts import run_all
from jaxloader.base.stats import LoaderStats
from jaxloader.engines.in_process import Engine, InProcessEngine, Maker
from jaxloader.loaders.iterator import LoaderIterator, Progress
from jaxloader.loaders.options import LoaderOptions, Placement


class LoaderLifecycle:
    """Position, statistics, Orbax v1 hooks and shutdown, shared by the loaders."""

    _progress: Progress
    _active: LoaderIterator | None
    _engine: Engine
    _options: LoaderOptions
    _placement: Placement

    def _start_engine(self, maker: Maker,
                      worker_init_fn: Callable[[int], None] | None) -> Engine:
        """The engine of ``maker``'s batches: in this process, or worker processes."""
        options = self._options
        if options.num_workers == 0:
            return InProcessEngine(maker)
        from jaxloader.workers.pool import WorkerPool

        return WorkerPool(maker, options.num_workers, prefetch=options.prefetch,
                          start_method=options.start_method, worker_init_fn=worker_init_fn,
                          stall_warning_s=options.stall_warning_s, timeout_s=options.timeout_s)

    @property
    def batch_size(self) -> int:
        """Records per batch in this process."""
        return self._placement.batch_size

    @property
    def process_index(self) -> int:
        """This process's place among the processes sharing the global batch."""
        return self._placement.process_index

    @property
    def process_count(self) -> int:
        """Processes sharing the global batch (``batch_size * process_count`` records)."""
        return self._placement.process_count

    @property
    def num_workers(self) -> int:
        return self._options.num_workers

    @property
    def num_epochs(self) -> int | None:
        """Epochs per ``iter(loader)``; ``None``: endless."""
        return self._options.num_epochs

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the worker processes (empty with ``num_workers=0``)."""
        return self._engine.pids

    @property
    def step(self) -> int:
        """The global step of the next batch this loader hands out."""
        return self._progress.step

    @property
    def stats(self) -> LoaderStats:
        """Batches handed out, time waited inside ``next()`` and time run between calls."""
        return self._progress.stats()

    def reset_stats(self) -> None:
        self._progress.reset_stats()

    def _invalidate(self, until_gone: bool = True) -> bool:
        """Makes live iterators stale and stops what they run (thread, engine run), waiting
        for the device-prefetch thread until it is gone: a new run must not start beside it
        (an in-process engine's reader or cache is not for two threads at once). ``close()``
        waits at most the join timeout instead; whether nothing runs any more."""
        self._progress.generation += 1
        gone = True
        if self._active is not None:
            gone = self._active.stop_work(until_gone)
            self._active = None
        return gone

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    # -- orbax v1 (StatefulCheckpointable) ----------------------------------------------------
    async def save(self, directory: Any) -> Any:
        """Orbax v1 ``StatefulCheckpointable.save``: this process's state as a JSON file.

        Example:
            >>> import tempfile, numpy as np, jaxloader as jl
            >>> from orbax.checkpoint.experimental import v1 as ocp_v1
            >>> loader = jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2,
            ...                        process_index=0, process_count=1)
            >>> _ = next(iter(loader))
            >>> path = tempfile.mkdtemp() + "/ckpt"
            >>> ocp_v1.save_checkpointables(path, {"loader": loader})
            >>> fresh = jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2,
            ...                       process_index=0, process_count=1)
            >>> _ = ocp_v1.load_checkpointables(path, {"loader": fresh})
            >>> fresh.step
            1
        """
        from jaxloader.loaders.state_files import save_v1

        return await save_v1(self, directory)

    async def load(self, directory: Any) -> Any:
        """Orbax v1 ``StatefulCheckpointable.load``: continues from the saved position."""
        from jaxloader.loaders.state_files import load_v1

        return await load_v1(self, directory)

    # -- shutdown ---------------------------------------------------------------------------
    def close(self) -> None:
        """Releases workers and buffers, without waiting for batches in flight (workers busy
        in a transform are killed); idempotent."""
        self._progress.closed = True
        gone: list[bool] = []
        # Every call runs every step (each is idempotent): a Ctrl-C while the prefetch thread
        # is joined must not skip the workers (``jaxloader.base.interrupts``, 4), and one that lands
        # before the steps began (as ``run_all`` starts) leaves them to the next close().
        run_all([lambda: gone.append(self._invalidate(until_gone=False)), self._engine.close,
                 lambda: self._release(bool(gone) and gone[0])])

    def _release(self, idle: bool) -> None:
        """What a loader frees once its engine is closed (``idle``: no thread of it still
        makes a batch in this process)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
