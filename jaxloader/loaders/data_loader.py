"""``DataLoader``: wires options, sampler, batch maker, engine and device placement; state.

::

    DataLoader ── Progress: the global step of the next batch handed to the user, ...
       │ iter() ─> LoaderIterator(start=step, stop=end of the pass (num_epochs each) | endless)
       │              └─ engine.batches(start, stop) ─> BatchMaker.make(step) in order
       └ state_dict() = {"step": ..., config and a fingerprint of the source};
         load_state_dict() moves the step, O(1)

See ``jaxloader.loaders.iterator`` for iteration and ``jaxloader.engines.in_process`` for the engines.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any, Callable, Generic, Literal, Never, cast

import numpy as np

from jaxloader.base.abilities import order_check_of
from jaxloader.sources.fingerprint import (older_fingerprint, older_records, source_files,
                                          source_fingerprint)
from jaxloader.loaders.iterator import BatchT, IteratorWork, LoaderIterator, Progress
from jaxloader.loaders.pass_notes import say_later_pass, say_new_pass
from jaxloader.loaders.base import LoaderLifecycle, Workers, label
from jaxloader.loaders.options import (LoaderOptions, StartMethod, automatic, jax_pending,
                                       placement)
from jaxloader.loaders.foreign_arguments import (REQUIRED, TorchAttributes, peeked,
                                                 refuse_call)
from jaxloader.batching.batch_maker import BatchMaker
from jaxloader.engines.in_process import made_here
from jaxloader.base import read_threads as read_pool
from jaxloader.base.checks import Int, check_int, source_said
from jaxloader.base.errors import ConfigError, RecordError
from jaxloader.base.timings import StageClock
from jaxloader.workers.source_copies import reading
from jaxloader.order.local_shuffle import LocalShuffle
from jaxloader.sources.mixture import Mixture, refuse_held_mixture
from jaxloader.order.sampling import LastBatch
from jaxloader.loaders.record_order import sampler_for, unread_records
from jaxloader.sources import ConcatSource, check_source, huggingface
from jaxloader.sources.base import Source
from jaxloader.sources.parts import close_source, walk
from jaxloader.loaders.state import check_state, make_state
from jaxloader.loaders.transform_names import (compared_transforms, exact_settings,
                                               older_transforms_of, transforms_of)
from jaxloader.batching.transforms import Transforms, split_transforms
from jaxloader.sharding.pairing import Pairing


class DataLoader(LoaderLifecycle, TorchAttributes, Generic[BatchT]):
    """Batches of a random-access source, deterministic in ``(seed, epoch, step)``.

    Args:
        source: an ``ArraySource`` or any object with ``__len__``/``__getitem__``.
        batch_size: records per batch *per process*; the global batch is
            ``batch_size * process_count``.
        shuffle: reshuffle every epoch with an O(1)-memory index shuffle; or
            ``LocalShuffle(window=8)``: shuffle blocks of neighbouring records (a Parquet
            file's row groups) and records within windows of blocks, for data in files. A
            ``ParquetSource`` whose cache holds less than the order reads at once warns
            (``PerformanceWarning``).
        seed: seeds the shuffle and every ``RandomMap`` (in ``[0, 2**64)``; loaders alike).
        transforms: a list: ``Map``/``RandomMap`` (per record), then a ``Pad`` (records of
            other lengths padded to their batch's longest), then ``JitMap`` and ``BatchMap``
            (per batch); a bare function in it is a ``Map``. One transform may be given
            alone: ``transforms=f`` is ``transforms=[Map(f)]``.
        num_workers: worker processes; 0 makes batches in the main process; ``"auto"``
            starts one and changes the count as it runs, from the rate and the consumer's wait
            (up to the cores this process may use, more while reads wait; each decision
            logged; ``loader.num_workers`` is the count in use). The batches do not depend on it.
        read_threads: a batch's records read on this many threads at once, in each worker (or
            in this process): for reads that wait (a network filesystem, a bucket, a
            database), as Grain's ``ReadOptions(num_threads=16)``; fewer processes then keep
            the waits overlapped. Each ``source[i]`` of a source read record by record
            (also inside a mixture, a concatenation or a filter), which must be safe to call
            from several threads at once; a source's own ``__getitems__`` reads as it does,
            and record transforms stay on one thread. The batches do not depend on it.
        last_batch: ``"drop"`` the short last batch of an epoch, ``"pad"`` it to full size with
            repeated records and a bool leaf ``batch[mask_key]`` (True on real rows; records must
            be dicts), or keep it ``"partial"`` (smaller; one process only).
        num_epochs: epochs per ``iter(loader)``, a pass; ``None`` for an endless iterator.
            Passes are counted from epoch 0: ``iter()`` gives the rest of the pass the
            position is in, so a loader restored mid-pass ends where the saved run would.
        prefetch: tasks in flight per worker (``num_workers > 0``); a task is as many of
            the worker's steps as fit in 1 MiB of batches, up to 16 (one for larger batches
            and for streams), so that a small batch costs a share of a task's messages.
            Small batches get more tasks, as many as hold ``prefetch`` MiB, up to 64 steps
            a worker and 256 in all: room to run ahead past a source's stalls. ``"auto"``
            (with ``num_workers="auto"``): 2, doubled up to 8 while the loop waits on idle
            workers (batches that come in bursts).
        worker_init_fn: called as ``fn(worker_id)`` in each worker once it has started;
            ``jaxloader.get_worker_info()`` tells a worker its id, the count and the seed.
        start_method: ``"exec"`` (default): workers are fresh interpreters that never re-run
            your main script and are never forked from a process running JAX (on Linux,
            forks of the worker starter: ``jaxloader.workers.starter``); ``"fork"``: forks
            of this process, refused once JAX is imported.
        process_index, process_count: this process's place among the hosts that share the
            global batch; default to ``jax.process_index()``/``jax.process_count()``, asked
            only once JAX runs in this process or ``jax.distributed`` is initialised (else it
            is the only one: JAX is not started for it, so ``start_method="fork"`` and
            ``jax.distributed.initialize()`` stay open; ``iter()`` checks again, and refuses
            a loader made before ``jax.distributed.initialize()``). With a ``sharding`` over
            several processes, each process reads the rows of the global batch its devices
            hold in the mesh, whatever the mesh's order.
        mask_key: name of the mask leaf added by ``last_batch="pad"``.
        sharding: a ``jax.sharding.Sharding``, a pytree of them (a prefix of the batch), or
            ``jaxloader.data_sharding(mesh, "data")``; a ``PartitionSpec`` over the mesh of
            ``jax.set_mesh``, or a device; batches are then of global ``jax.Array`` leaves
            (``batch_size * process_count`` rows), placed ahead by a background thread (one
            device) or by ``next()`` in your thread (several devices;
            docs/guides/devices_and_hosts.md).
        device_prefetch: batches kept ready on device ahead of the consumer (with ``sharding``;
            2 if not given); 0 places each batch in ``next()``. Given (above 0) without a
            sharding, it is warned of: it acts on placed batches alone.
        stall_warning_s: with workers, a batch awaited this long, while the worker that holds
            it begins no step, is logged (``logging`` ``"jaxloader"``): which worker holds
            which step, for how long, its process state and Python stack; said again every
            ``stall_warning_s``. ``None``: never.
        timeout_s: with workers, a batch awaited this long, as ``stall_warning_s`` counts it,
            raises ``StallError`` with the same report (the loader is then broken); ``None``
            (the default): waits as long as it takes. With ``num_workers=0`` the batch is made
            in your thread: Ctrl-C shows where.
        log_every_s: logs a one-line summary with the verdict (``loader.diagnose()``) every
            this many seconds (``logging`` ``"jaxloader"``, INFO); ``None``: never.
        workers: ``jaxloader.ray.RayWorkers(n, **actor_options)``: the batches made by ``n``
            Ray actors, on this machine or others (``num_workers`` stays 0); the same batches
            and states as local workers.
        unknown: PyTorch's and Grain's names (``drop_last``, ``collate_fn``, ``pin_memory``,
            ``worker_count``, ...) raise a ``TypeError`` saying what to pass instead.

    ``loader.peek()`` gives the next batch without moving the position (to build a model from
    its shapes). Two ways to loop, both resumable with ``state_dict()``:

        >>> import numpy as np, jaxloader as jl
        >>> source = jl.ArraySource({"x": np.arange(1_024)})
        >>> with jl.DataLoader(source, batch_size=128, shuffle=True, seed=0) as loader:
        ...     for epoch in range(3):      # each iter() is the next epoch, reshuffled
        ...         sizes = [batch["x"].shape[0] for batch in loader]
        >>> sizes, loader.state_dict()["step"]
        ([128, 128, 128, 128, 128, 128, 128, 128], 24)
        >>> with jl.DataLoader(source, batch_size=128, shuffle=True, num_epochs=None) as loader:
        ...     it = iter(loader)               # endless: a step loop
        ...     for step in range(100):
        ...         batch = next(it)
        >>> loader.state_dict()["step"]
        100
    """

    def __init__(
        self,
        source: Source = REQUIRED,
        *extra: Never,
        batch_size: Int = REQUIRED,
        shuffle: bool | np.bool_ | LocalShuffle = False,
        seed: Int = 0,
        transforms: Transforms = (),
        num_workers: Int | Literal["auto"] = 0,
        read_threads: Int = 1,
        last_batch: LastBatch = "drop",
        num_epochs: Int | None = 1,
        process_index: Int | None = None,
        process_count: Int | None = None,
        mask_key: str = "mask",
        prefetch: Int | Literal["auto"] = 2,
        worker_init_fn: Callable[[int], object] | None = None,
        start_method: StartMethod = "exec",
        sharding: Any = None,
        device_prefetch: Int | None = None,
        stall_warning_s: float | None = 300.0,
        timeout_s: float | None = None,
        log_every_s: float | None = None,
        workers: Workers | None = None,
        **unknown: Never,
    ) -> None:
        from jaxloader.streams import PackedStream, Stream, mixed

        refuse_call("DataLoader", source, extra, unknown, batch_size, type(self))
        if isinstance(source, (Stream, PackedStream, mixed.MixedStream)):  # (any stream)
            raise ConfigError(f"DataLoader(source): got a {type(source).__name__}, a stream, with "
                              "no random access; read it with jaxloader.StreamLoader(stream, ...)")
        num_records = check_source(source)
        refuse_held_mixture(source)
        source = huggingface.adapt(source)  # a datasets.Dataset is read in NumPy format
        self._jax_pending = jax_pending(process_index, process_count)
        self._placement = placement(batch_size, process_index, process_count)
        self._putter = self._putter_for(sharding, process_index,
                                        mask=mask_key if last_batch == "pad" else None)
        batch_size, process_index, process_count = self._placement
        count, auto_workers = automatic("num_workers", num_workers, start=1)
        ahead, auto_prefetch = automatic("prefetch", prefetch, start=2)
        rows = None if self._putter is None else self._putter.rows()  # (its devices' rows)
        self._sampler = sampler_for(source, num_records, batch_size, shuffle=shuffle,
                                    seed=seed, last_batch=last_batch,
                                    process_index=process_index, process_count=process_count,
                                    num_workers=count, rows=rows, ends=num_epochs is not None)
        for part in walk(source) if batch_size > 1 else ():  # (parts read together: refused
            if type(part) is ConcatSource:  # at the first batch that held both, hours in)
                part.check_alike(list(range(len(part.sources))))
        if isinstance(source, Mixture) and not transforms:  # (a Map may make them alike)
            source.check_phases()
        parts = source.sources if isinstance(source, ConcatSource) else ()  # a mixture too
        for part in (source, *parts):  # a file source's cache against what the order reads
            check_order = order_check_of(part)
            if check_order is not None:
                check_order(shuffle)
        self._options = LoaderOptions(  # (its ints made Python's as they are checked)
            count, cast("int | None", num_epochs), mask_key, ahead, start_method,
            cast("int | None", device_prefetch), stall_warning_s, timeout_s, log_every_s,
            auto_workers, auto_prefetch, unplaced=self._putter is None,
            unmasked="" if last_batch == "pad" else "last_batch='pad'")
        record_transforms, batch_transforms = split_transforms(transforms,
                                                               process_count=process_count)
        rest = self._sampler.num_records % batch_size  # (a mixture's batches are all full)
        if self._putter is not None and last_batch == "partial" and rest and \
                not isinstance(source, Mixture):
            self._putter.check_last_batch(rest, self._sampler.num_records)
        self._source, self._num_records = source, num_records
        threads = check_int("read_threads", read_threads, low=1, high=1024,
                            remedy="threads reading a batch's records in each worker (1: one "
                                   "record after the other)")
        self._maker = BatchMaker(source, self._sampler, record_transforms, batch_transforms,
                                 mask_key, threads)
        # (this process's pool of them, for num_workers=0 and peek(): let go at close())
        pool = self._maker.pool_key
        self._read_pool = weakref.finalize(self, read_pool.hold(pool)) if threads > 1 else None
        self._fingerprint: dict[str, Any] | None = None  # computed on first use, then kept
        self._transforms = (*record_transforms, *batch_transforms)
        self._transforms_named: list[str] | None = transforms_of(self._transforms)  # (as
        # made: a memo a transform fills as it runs in this process is not another transform)
        self._files = source_files(source)  # (path, identity) of each file it reads
        self._progress = Progress(where=self._maker.location)
        self._progress.label = label("DataLoader", source, batch_size)
        self._active: IteratorWork | None = None
        self._pairing = Pairing("DataLoader", self)  # (its iter()s: sharding.pairing)
        # (told after the arguments' checks, so a refused loader does not warn first; before
        # the engine's start, so a warning made an error (-W error) leaves no process started)
        unread_records(self._sampler, source, last_batch, shuffle, num_epochs)
        self._engine = self._start_engine(self._maker, worker_init_fn, workers)
        self._set_up_in_workers = worker_init_fn is not None and hasattr(self._engine, "copies")

    # -- sizes, placement and position ------------------------------------------------------
    def __len__(self) -> int:
        """Batches per epoch."""
        return self._sampler.steps_per_epoch

    def _reads(self) -> str:
        return f"{source_said(self._source)}, {len(self)} batches an epoch"

    @property
    def epoch(self) -> int:
        """The epoch of the next batch."""
        return self._progress.step // self._sampler.steps_per_epoch

    def peek(self) -> BatchT:
        """The batch at the loader's position (the next ``next()`` gives it; after a pass ran
        out, the next pass's first, which a new ``iter()`` gives), without moving the position.

        Made in this process (also with workers), and placed like the others when a sharding
        is given: use it to build a model from the batch's shapes.

        Example:
            >>> import numpy as np, jaxloader as jl
            >>> loader = jl.DataLoader(jl.ArraySource({"x": np.zeros((8, 3))}), batch_size=4,
            ...                        process_index=0, process_count=1)
            >>> loader.peek()["x"].shape, loader.step
            ((4, 3), 0)
        """
        self._check_placement()
        self._progress.check()
        self._check_length()
        if hasattr(self._engine, "copies"):  # (a worker pool's copies of the source's arrays)
            self._engine.copies.check()
        peeker = copy.copy(self._maker)  # (a clock of its own: a peek is no batch of the
        peeker.clock = StageClock()  # stats; the maker's may be a device thread's meanwhile)
        try:
            with reading(self._engine):
                batch, _ = made_here(peeker, self._progress.step)
        except RecordError as e:
            raise peeked(e) if self._set_up_in_workers else e
        return batch if self._putter is None else self._putter(batch)

    def __iter__(self) -> LoaderIterator[BatchT]:
        """The batches of the pass the position is in (``num_epochs`` epochs), from it on."""
        self._progress.check()
        self._check_placement()
        self._check_length()
        self._invalidate()
        say_new_pass(self._progress, self.num_epochs)
        start = self._progress.step
        stop = None
        if self.num_epochs is not None:  # the pass the position is in: epochs [k n, (k+1) n)
            n = self.num_epochs
            stop = (self.epoch // n + 1) * n * self._sampler.steps_per_epoch
            if not self._probing:  # (a loop over epochs around passes: said once)
                say_later_pass(self._progress, n, self.epoch, start == stop - n * (
                    self._sampler.steps_per_epoch))
        put = self._putter
        layout = self._sampler.layout  # (a LocalShuffle's blocks: the same on every process)
        named = compared_transforms(self._transforms_state())
        hosts = None if self.process_count == 1 or self._probing else self._pairing.publish(
            {**make_state(self._sampler, start, self._source_fingerprint(), named),
             "num_epochs": self.num_epochs, **({"local_shuffle_blocks": layout} if layout
                                              else {}), **exact_settings(named, self._source),
             **({"mask_key": self._options.mask_key} if self._sampler.last_batch == "pad"
                else {}),
             **({"meshes": put.meshes()} if put is not None else {})},
            self.process_count, index=self.process_index)
        active = LoaderIterator(
            self._progress, start, stop, self._engine, put, self.device_prefetch,
            single_device=put is not None and put.single_device, monitor=self._monitor,
            hosts=hosts, epochs=(self._sampler.steps_per_epoch, self._check_length),
        )
        self._active = active.work
        return active._start()  # its work held first: a Ctrl-C in _start() leaves it to _invalidate

    def _check_length(self) -> None:
        """A source whose length moved since the loader was made is refused: the order covers
        the records it had then (records added were never read, and with workers those
        removed were read from the workers' copies), as the workers' copies do. Asked at
        ``iter()``, at each epoch's start (an endless loader's source may grow: a replay
        buffer) and by ``state_dict()`` (its fingerprint would be the grown source's, its
        length the loader's: a state no source restores)."""
        now = len(self._source)
        if now != self._num_records:
            raise ConfigError(
                f"the source's length changed from {self._num_records} to {now} since the "
                "loader was made: the loader's order, and the copies of the source its workers "
                "took then, are the source as it was; keep a source unchanged while a loader "
                "reads it, or make a new DataLoader for it")

    # -- state ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The position (next global step), the configuration it depends on and a fingerprint
        of the source; JSON-ready.

        Example:
            >>> import numpy as np, jaxloader as jl
            >>> def make():
            ...     return jl.DataLoader(jl.ArraySource({"x": np.arange(10)}), batch_size=2,
            ...                          shuffle=True, seed=0, process_index=0, process_count=1)
            >>> loader = make()
            >>> it = iter(loader); _ = next(it)
            >>> state = loader.state_dict()
            >>> state["step"], next(it)["x"].tolist()
            (1, [6, 2])
            >>> again = make(); again.load_state_dict(state)  # (another run: the same batch)
            >>> next(iter(again))["x"].tolist()
            [6, 2]
        """
        self._check_placement()
        self._check_length()
        return make_state(self._sampler, self._progress.step, self._source_fingerprint(),
                          self._transforms_state())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from ``state`` (O(1)); live iterators of this loader stop being valid.
        A state of another source, batch size, seed or shuffle is refused, naming what differs
        (``StateDictError``); one of another worker count or host count continues exactly.
        Example: ``state_dict``'s."""
        self._progress.check()  # (broken or closed: it moved, and no iterator would go on)
        self._check_placement()
        with reading(self._engine):  # (older states: records read again, as they held them)
            step = check_state(state, self._sampler, self._source_fingerprint(),
                               [path for path, _ in self._files],
                               lambda: (*older_fingerprint(self._source), *older_records(
                                   self._source)), self._transforms_state(),
                               lambda: older_transforms_of(self._transforms),
                               self._source.label if isinstance(self._source, ConcatSource)
                               else None)
        self._invalidate()  # (first: a next() in another thread then cannot set its step after)
        self._progress.step = step
        n, epoch = self.num_epochs, step // self._sampler.steps_per_epoch
        self._progress.at_pass_end = f"epoch {epoch}" + (f" to {epoch + n - 1}" if n > 1 else "") \
            if n and step and not step % (n * self._sampler.steps_per_epoch) else ""

    def _transforms_state(self) -> list[str]:
        if self._transforms_named is None:
            self._transforms_named = transforms_of(self._transforms)
        return self._transforms_named

    def _source_fingerprint(self) -> dict[str, Any]:
        if self._fingerprint is None:
            with reading(self._engine):
                self._fingerprint = dict(source_fingerprint(self._source))
            if self._files:  # (a file source's bytes, named file by file)
                self._fingerprint["files"] = [identity for _, identity in self._files]
        return self._fingerprint

    def _release(self, idle: bool) -> None:
        """Closes the files the source holds open in this process (``peek``,
        ``num_workers=0``) and lets its read threads go, unless a device-put thread still
        makes a batch from it, or its read threads still read (a Ctrl-C left them: they end
        with their reads; the files close when the source goes, the threads with the loader)."""
        if idle and not read_pool.busy(self._maker.pool_key):
            close_source(self._source)
            if self._read_pool is not None:  # (else let go when the loader goes)
                self._read_pool()
