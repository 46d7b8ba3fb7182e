"""``DataLoader``: wires sampler, batch maker and engine; iteration and state.

::

    DataLoader ── cursor: the global step of the next batch handed to the user
       │ iter() ─> LoaderIterator(start=cursor, stop=end of epoch (+ num_epochs-1) | endless)
       │              └─ engine.batches(start, stop) ─> BatchMaker.make(step) in order
       └ state_dict() = {"step": cursor, ...config}; load_state_dict() moves the cursor, O(1)

The cursor moves when a batch is handed to the user, never earlier, so ``state_dict()`` taken
between two ``next()`` calls always names the next batch the user would have seen.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Callable, Iterator, Sequence

from jaxloader.errors import ConfigError, JaxloaderError, WorkerError
from jaxloader.pipeline import BatchMaker
from jaxloader.sampling import Sampler
from jaxloader.sharding.prefetch import DevicePrefetcher
from jaxloader.sources import check_source
from jaxloader.state import check_state, make_state
from jaxloader.stats import LoaderStats
from jaxloader.transforms import split_transforms


class _InProcessEngine:
    """Makes batches in the calling thread (``num_workers=0``)."""

    def __init__(self, maker: BatchMaker) -> None:
        self._maker = maker

    def batches(self, start: int, stop: int | None) -> Iterator[Any]:
        steps = itertools.count(start) if stop is None else range(start, stop)
        make = self._maker.make
        for step in steps:
            yield make(step)[0]

    def close(self) -> None:
        pass


class DataLoader:
    """Batches of a random-access source, deterministic in ``(seed, epoch, step)``.

    Args:
        source: an ``ArraySource`` or any object with ``__len__``/``__getitem__``.
        batch_size: records per batch *per process*; the global batch is
            ``batch_size * process_count``.
        shuffle: reshuffle every epoch with an O(1)-memory index shuffle.
        seed: seeds the shuffle and every ``RandomMap`` (an int in ``[0, 2**64)``).
        transforms: ``Map``/``RandomMap`` (per record), then ``BatchMap`` (per batch).
        num_workers: worker processes; 0 makes batches in the main process.
        last_batch: ``"drop"`` the short last batch of an epoch, ``"pad"`` it to full size with
            repeated records and a bool leaf ``batch[mask_key]`` (True on real rows; records must
            be dicts), or keep it ``"partial"`` (smaller; one process only).
        num_epochs: epochs per ``iter(loader)``; ``None`` for an endless iterator.
        prefetch: batches in flight per worker (``num_workers > 0``).
        worker_init_fn: called as ``fn(worker_id)`` in each worker once it has started;
            ``jaxloader.get_worker_info()`` tells a worker its id, the count and the seed.
        start_method: ``"exec"`` (default): workers are fresh interpreters that never re-run
            your main script and are never forked from a process running JAX; ``"fork"``:
            faster start, refused once JAX is imported.
        process_index, process_count: this process's place among the hosts that share the
            global batch; default to ``jax.process_index()``/``jax.process_count()``.
        mask_key: name of the mask leaf added by ``last_batch="pad"``.
        sharding: a ``jax.sharding.Sharding``, a pytree of them (a prefix of the batch), or
            ``jaxloader.data_sharding(mesh, "data")``; batches are then global ``jax.Array``s
            (``batch_size * process_count`` rows), placed ahead by a background thread (one
            device) or by ``next()`` in your thread (several devices; see the README).
        device_prefetch: batches kept ready on device ahead of the consumer (with ``sharding``);
            0 places each batch in ``next()``.

    Two ways to loop, both resumable with ``state_dict()``::

        loader = DataLoader(ArraySource(arrays), batch_size=128, shuffle=True, seed=0)
        for epoch in range(3):          # each iter() is the next epoch, reshuffled
            for batch in loader:
                ...

        loader = DataLoader(ArraySource(arrays), batch_size=128, shuffle=True, num_epochs=None)
        it = iter(loader)               # endless: a step loop
        for step in range(10_000):
            batch = next(it)
    """

    def __init__(
        self,
        source: Any,
        *,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        transforms: Sequence[Any] = (),
        num_workers: int = 0,
        last_batch: str = "drop",
        num_epochs: int | None = 1,
        process_index: int | None = None,
        process_count: int | None = None,
        mask_key: str = "mask",
        prefetch: int = 2,
        worker_init_fn: Callable[[int], None] | None = None,
        start_method: str = "exec",
        sharding: Any = None,
        device_prefetch: int = 2,
    ) -> None:
        num_records = check_source(source)
        if process_index is None or process_count is None:
            import jax  # only when the caller leaves it to JAX; workers never get here

            process_index = jax.process_index() if process_index is None else process_index
            process_count = jax.process_count() if process_count is None else process_count
        self._sampler = Sampler(
            num_records, batch_size, shuffle=shuffle, seed=seed, last_batch=last_batch,
            process_index=process_index, process_count=process_count,
        )
        if num_epochs is not None and (isinstance(num_epochs, bool) or not isinstance(num_epochs, int)
                                       or num_epochs < 1):
            raise ConfigError(
                f"num_epochs: expected an int >= 1 or None (endless), got {num_epochs!r}"
            )
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ConfigError(
                f"num_workers: expected an int >= 0, got {num_workers!r}; 0 runs in this process"
            )
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ConfigError(f"prefetch: expected an int >= 1 (batches per worker), got {prefetch!r}")
        if isinstance(device_prefetch, bool) or not isinstance(device_prefetch, int) or (
                device_prefetch < 0):
            raise ConfigError(
                f"device_prefetch: expected an int >= 0 (batches ready on device), got "
                f"{device_prefetch!r}"
            )
        self._putter = None
        if sharding is not None:
            from jaxloader.sharding.put import Putter

            self._putter = Putter(sharding, self._sampler.process_count)
        self.device_prefetch = device_prefetch
        record_transforms, batch_transforms = split_transforms(transforms)
        self._maker = BatchMaker(source, self._sampler, record_transforms, batch_transforms,
                                 mask_key)
        self.num_epochs = num_epochs
        self._step = 0
        self._generation = 0
        self._closed = False
        self._broken: JaxloaderError | None = None
        self._active: LoaderIterator | None = None
        self._stats = [0, 0.0, 0.0]  # batches, wait_s, run_s
        if num_workers == 0:
            self._engine: Any = _InProcessEngine(self._maker)
        else:
            from jaxloader.workers.pool import WorkerPool

            self._engine = WorkerPool(self._maker, num_workers, prefetch=prefetch,
                                      start_method=start_method, worker_init_fn=worker_init_fn)
        self.num_workers = num_workers

    # -- sizes and position ---------------------------------------------------------------
    def __len__(self) -> int:
        """Batches per epoch."""
        return self._sampler.steps_per_epoch

    @property
    def batch_size(self) -> int:
        return self._sampler.batch_size

    @property
    def step(self) -> int:
        """The global step of the next batch this loader hands out."""
        return self._step

    @property
    def epoch(self) -> int:
        """The epoch of the next batch."""
        return self._step // self._sampler.steps_per_epoch

    @property
    def stats(self) -> LoaderStats:
        """Batches handed out, time waited inside ``next()`` and time run between calls."""
        return LoaderStats(*self._stats)

    def reset_stats(self) -> None:
        self._stats = [0, 0.0, 0.0]

    # -- iteration --------------------------------------------------------------------------
    def __iter__(self) -> "LoaderIterator":
        self._check_open()
        self._invalidate()
        start = self._step
        stop = None
        if self.num_epochs is not None:
            stop = (self.epoch + self.num_epochs) * self._sampler.steps_per_epoch
        self._active = LoaderIterator(self, self._generation, start, stop)
        return self._active

    def _invalidate(self) -> None:
        """Makes live iterators stale and stops what they run (thread, engine run)."""
        self._generation += 1
        if self._active is not None:
            self._active._stop_work()
            self._active = None

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The position (next global step) and the configuration it depends on; JSON-ready."""
        return make_state(self._sampler, self._step)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from ``state`` (O(1)); live iterators of this loader stop being valid."""
        self._step = check_state(state, self._sampler)
        self._invalidate()

    # -- orbax v1 (StatefulCheckpointable) ----------------------------------------------------
    async def save(self, directory: Any) -> Any:
        """Orbax v1 ``StatefulCheckpointable.save``: this process's state as a JSON file.

        Example:
            >>> from orbax.checkpoint.experimental import v1 as ocp_v1     # doctest: +SKIP
            >>> ocp_v1.save_checkpointables(path, {"state": state, "loader": loader})  # doctest: +SKIP
        """
        from jaxloader.checkpoint import save_v1

        return await save_v1(self, directory)

    async def load(self, directory: Any) -> Any:
        """Orbax v1 ``StatefulCheckpointable.load``: continues from the saved position."""
        from jaxloader.checkpoint import load_v1

        return await load_v1(self, directory)

    # -- shutdown ---------------------------------------------------------------------------
    def close(self) -> None:
        """Releases workers and buffers; idempotent."""
        if not self._closed:
            self._closed = True
            self._invalidate()
            self._engine.close()

    def __enter__(self) -> "DataLoader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._broken is not None:
            raise self._broken
        if self._closed:
            raise JaxloaderError("DataLoader is closed; create a new one to iterate again")


class LoaderIterator:
    """Yields batches from a start step; valid until the next ``iter()``, restore or close."""

    def __init__(self, loader: DataLoader, generation: int, start: int, stop: int | None) -> None:
        self._loader = loader
        self._generation = generation
        self._step = start
        self._stop = stop
        self._prefetcher: DevicePrefetcher | None = None
        self._last_return: float | None = None
        self._start_work()

    def _start_work(self) -> None:
        """The engine run (and device prefetch) from this iterator's step."""
        loader = self._loader
        self._batches = loader._engine.batches(self._step, self._stop)
        put = loader._putter
        if put is None:
            self._next: Callable[[], Any] = self._batches.__next__
        elif loader.device_prefetch == 0:
            self._next = lambda: put(next(self._batches))
        else:
            self._prefetcher = DevicePrefetcher(self._batches, put, loader.device_prefetch,
                                                put_in_thread=put.single_device)
            self._next = self._prefetcher.next
            self._prefetcher.start()  # held before it runs: an interrupt cannot orphan it
        self._interrupted = False

    def __iter__(self) -> "LoaderIterator":
        return self

    def __next__(self) -> Any:
        entered = time.perf_counter()
        loader = self._loader
        if loader._broken is not None:
            raise loader._broken
        if loader._generation != self._generation:
            loader._check_open()
            raise JaxloaderError(
                "this iterator is stale: iter(), load_state_dict() or close() was called on its "
                "DataLoader since it was made; call iter(loader) again"
            )
        if self._stop is not None and self._step >= self._stop:
            raise StopIteration
        if self._interrupted:
            # Until the old thread is gone (the first try may itself have been cut short):
            # two threads must never drive the engine at once.
            self._stop_work(until_gone=True)
            self._start_work()
        try:
            batch = self._next()
            returned = time.perf_counter()
        except WorkerError as e:
            loader._broken = e
            raise
        except StopIteration:
            raise
        except BaseException:
            # Ctrl-C, or a transform's error with num_workers=0: whatever was in flight is
            # dropped, and the next call makes this same step again, so nothing is skipped.
            self._interrupted = True
            self._last_return = None
            self._stop_work()
            raise
        # No calls from here to the return: a signal cannot split the step from its batch.
        self._step += 1
        loader._step = self._step
        stats = loader._stats
        stats[0] += 1
        stats[1] += returned - entered
        if self._last_return is not None:
            stats[2] += entered - self._last_return
        self._last_return = returned
        return batch

    def _stop_work(self, until_gone: bool = False) -> None:
        """Stops the host-batch thread (waiting for it at most its join timeout, or
        ``until_gone``) or closes the engine run (frees its slots)."""
        if self._prefetcher is not None:
            self._prefetcher.close(until_gone)
        else:
            self._batches.close()
