"""``StreamLoader``: batches of a ``Stream`` (no random access), with exact resume.

::

    StreamLoader ── Progress (the step of the next batch handed out) ─ iter() ─> LoaderIterator
       │              └─ _ReaderRuns.batches(start) ─> engine.batches(start, resets, …)
       │                    resets: each reader's state as of `start` (what was handed out)
       │                    reports[step]: the reader's state after that step's batch
       └ state_dict() = {"step", "readers": [state per reader of this process], config}

This process has ``W = max(1, num_workers)`` readers; step ``s`` is the ``s // W``-th batch of
reader ``s % W`` (made in worker ``s % W``). Workers read ahead (prefetch), so the state of a
reader is taken from the report of the last batch *handed out* by it, never from where its worker
has got to: a state names exactly the next batch, and a restore continues the same stream. The
order is fixed for a given ``(seed, process_count, num_workers)``; a state restores into a loader
with the same counts (0 and 1 workers are the same: one reader), and is refused with another count.

A pass that ends (``num_epochs=n``): ``iter()`` gives each reader the epoch it stops before
(``"until"`` in the states it resets from: the end of the pass of ``n`` epochs, counted from
epoch 0, that it is in, or of the next pass once every reader is done); a reader out of
records pads its batch (``mask``) and its report says ``"ended"``. Before each step the
iterator asks whether every reader is done (with several processes, all of theirs: a vote
through ``jax.distributed``'s store on the consumer's thread, ``sharding.pass_votes``), and
ends.
"""

from __future__ import annotations

import copy
import functools
import threading
import weakref
from typing import Any, Callable, Generic, Literal, Never, cast

from jaxloader.base.checks import MASK64, Int, check_int
from jaxloader.base.errors import ConfigError, JaxloaderError
from jaxloader.base.state_copy import copied
from jaxloader.loaders.stream_copies import at_step, pristine, where_of
from jaxloader.loaders.iterator import BatchT, IteratorWork, LoaderIterator, Progress
from jaxloader.loaders.pass_notes import say_later_pass, say_new_pass
from jaxloader.sharding.pairing import Pairing
from jaxloader.sharding.pass_votes import PassVotes
from jaxloader.loaders.base import LoaderLifecycle, Workers, label
from jaxloader.loaders.options import (LoaderOptions, StartMethod, automatic, jax_pending,
                                       placement)
from jaxloader.loaders.foreign_arguments import REQUIRED, StreamAttributes, refuse_call
from jaxloader.loaders.older_states import as_written_now
from jaxloader.loaders.state import STATE_VERSION, check_stream_state
from jaxloader.loaders.transform_names import (older_transforms_of, transforms_of,
                                               warn_changed_generators, warn_changed_transforms)
from jaxloader.batching.stream_batch_maker import StreamBatchMaker
from jaxloader.engines.in_process import made_here
from jaxloader.loaders.stream_positions import StreamPositions
from jaxloader.loaders.stream_runs import ReaderRuns, published
from jaxloader.sharding.prefetch import Stopped
from jaxloader.streams import passes
from jaxloader.streams.contract import ReadableStream, StreamLike
from jaxloader.streams.iterable_shards import codes_of, older_codes_of
from jaxloader.streams.reader import Stream, as_stream
from jaxloader.batching.transforms import Transforms, split_transforms



class StreamLoader(LoaderLifecycle, StreamPositions, StreamAttributes, Generic[BatchT]):
    """Batches of a stream of records read in order: files of lines or tar shards, generators.

    ``transforms``, ``num_workers``, ``prefetch``, ``worker_init_fn``, ``start_method``,
    ``process_index``, ``process_count``, ``sharding``, ``device_prefetch``,
    ``stall_warning_s``, ``timeout_s`` and ``log_every_s`` are as for ``DataLoader`` (a
    generator that blocks in a worker is reported as a transform is).

    Args:
        stream: a ``jaxloader.Stream`` (``Stream.jsonl(paths)``, ``Stream.tar(paths)``,
            ``Stream.from_generator(fn, shards=n)``, or ``Stream(shards)``), a list of shards,
            streams mixed by weight (``jl.mix([stream_a, stream_b], [0.7, 0.3])``), or
            either packed into rows of tokens (``jl.PackedStream(stream, "tokens", 2048)``).
        batch_size: records per batch per process.
        seed: orders the shards each epoch, the shuffle windows and every ``RandomMap``.
        readers_per_process: the readers of this process (``K``; each reads its own share of
            the shards), by default ``max(1, num_workers)``; a multiple of ``num_workers``
            (each worker hosts ``K / num_workers``). The batches depend on ``K``, not on the
            workers: a state restores into any worker count that divides ``K`` (0 included).
        num_epochs: ``None`` (the default): endless, each reader going through its shards
            epoch after epoch; loop for a number of steps. ``n``: each ``iter(loader)`` is a
            pass of ``n`` epochs that ends, as a ``DataLoader``'s (an evaluation pass: every
            record ``n`` times). Every batch then has ``batch_size`` rows and a bool leaf
            ``batch[mask_key]``, True on records, False on the rows that pad a reader's last
            batch (and the batches of a reader done before the others). With several
            processes each ``next()`` of a pass agrees on the end with the others (an
            allgather through ``jax.distributed``), so all hosts take the same steps. A
            ``PackedStream``'s pass places every token once (its last row cut short); a
            pass over a ``mix`` of streams reads every record of every component once (a
            component run out gives its slots up to the others), or as
            ``mix(..., stopping_strategy="first_exhausted" | "all_exhausted")`` says.
        mask_key: the name of that leaf (records must be dicts).
        workers: ``jaxloader.ray.RayWorkers(n)``: the readers hosted by ``n`` Ray actors (``n``
            divides ``readers_per_process``; the same batches and states as ``n`` workers).
        unknown: PyTorch's and Grain's names (``shuffle``, ``drop_last``, ``collate_fn``, ...)
            raise a ``TypeError`` saying what a stream takes instead.

    Example:
        >>> import jaxloader as jl
        >>> stream = jl.Stream.from_generator(lambda i: ({"x": i * 100 + j} for j in range(6)),
        ...                                   shards=2, shuffle_shards=False)
        >>> loader = jl.StreamLoader(stream, batch_size=4, process_index=0, process_count=1)
        >>> it = iter(loader)
        >>> next(it)["x"].tolist(), loader.state_dict()["readers"][0]["emitted"]
        ([0, 1, 2, 3], 1)
        >>> once = jl.StreamLoader(stream, batch_size=5, num_epochs=1, process_index=0,
        ...                        process_count=1)
        >>> [(b["x"].tolist(), b["mask"].tolist()) for b in once][-1]
        ([104, 105, 105, 105, 105], [True, True, False, False, False])
    """

    def __init__(self, stream: StreamLike = REQUIRED, *extra: Never,
                 batch_size: Int = REQUIRED,
                 seed: Int = 0, transforms: Transforms = (),
                 num_workers: Int | Literal["auto"] = 0,
                 process_index: Int | None = None, process_count: Int | None = None,
                 prefetch: Int | Literal["auto"] = 2,
                 worker_init_fn: Callable[[int], object] | None = None,
                 start_method: StartMethod = "exec", sharding: Any = None,
                 device_prefetch: Int | None = None, readers_per_process: Int | None = None,
                 num_epochs: Int | None = None, mask_key: str = "mask",
                 stall_warning_s: float | None = 300.0, timeout_s: float | None = None,
                 log_every_s: float | None = None, workers: Workers | None = None,
                 **unknown: Never) -> None:
        refuse_call("StreamLoader", stream, extra, unknown, batch_size, type(self))
        given: Any = as_stream(stream)  # a Hugging Face IterableDataset: Stream.huggingface
        if not isinstance(given, ReadableStream):
            if not isinstance(given, (list, tuple)):
                if type(given).__name__ == "IterableDatasetDict":  # load_dataset, no split=
                    raise ConfigError(
                        f"StreamLoader(stream): got an IterableDatasetDict of "
                        f"{list(given)}; pass one of them: stream[{next(iter(given), '')!r}]"
                        " (or load_dataset(..., split='train', streaming=True))")
                if hasattr(given, "__len__") and hasattr(given, "__getitem__") and not (
                        isinstance(given, (str, bytes, dict)) or hasattr(given, "dtype")):
                    raise ConfigError(  # (a mix of sources, a source, a Dataset)
                        f"StreamLoader(stream): got a {type(given).__name__}, a source with "
                        "random access, not a stream; read it with jaxloader.DataLoader"
                        "(source, ...) (its shuffle, epochs and restore in O(1))")
                raise ConfigError(
                    f"StreamLoader(stream): expected a jaxloader.Stream or a list of shards, got "
                    f"{type(given).__name__}; for a generator use "
                    "Stream.from_generator(make, shards=n), for files Stream.jsonl/text/tar, for "
                    "a Hugging Face Dataset ds.to_iterable_dataset(num_shards=n)"
                )
            given = Stream(given)
        seed = check_int("seed", seed, low=0, high=MASK64, remedy="use a seed in [0, 2**64)")
        self._jax_pending = jax_pending(process_index, process_count)
        self._placement = placement(batch_size, process_index, process_count)
        self._putter = self._putter_for(sharding, process_index, by_block=True,
                                        mask=None if num_epochs is None else mask_key)
        batch_size, process_index, process_count = self._placement
        if num_workers == "auto" and readers_per_process is None:
            raise ConfigError("StreamLoader(num_workers='auto'): pass readers_per_process= too, "
                              "e.g. 8: the batches depend on it (the worker count does not), and "
                              "the loader chooses among the worker counts that divide it")
        count, auto_workers = automatic("num_workers", num_workers, start=1)
        ahead, auto_prefetch = automatic("prefetch", prefetch, start=2)
        self._options = LoaderOptions(  # (its ints made Python's as they are checked)
            count, cast("int | None", num_epochs), mask_key, ahead, start_method,
            cast("int | None", device_prefetch), stall_warning_s, timeout_s, log_every_s,
            auto_workers, auto_prefetch, unplaced=self._putter is None,
            unmasked="" if num_epochs is not None else "num_epochs=n (a pass's end)")
        if num_epochs is not None:
            passes.check(process_count)
            passes.idle_components(given, cast(int, num_epochs))
        passes.empty_files(given, endless=num_epochs is None)
        record_transforms, batch_transforms = split_transforms(
            transforms, filters=True, process_count=process_count)
        self._transforms = (*record_transforms, *batch_transforms)
        self._transforms_named: list[str] | None = transforms_of(self._transforms)  # (as made)
        self._stream: ReadableStream = given
        hosts = max(1, count) if workers is None else getattr(workers, "n", 1)  # readers' hosts
        named = "num_workers" if workers is None else "RayWorkers(n)"
        if getattr(workers, "min_actors", hosts) != hosts:
            raise ConfigError(f"StreamLoader(workers={workers!r:.80}): a stream's readers are "
                              "hosted by all n actors from its start; leave min_actors out")
        restarts = {"max_restarts", "max_task_retries"} & set(getattr(workers, "actor_options", {}))
        if restarts:  # (Ray's restarted actor would come back without its readers' states)
            raise ConfigError(f"StreamLoader(workers={workers!r:.80}): a stream's actor lost is "
                              "replaced by a new one continuing its readers from their states; "
                              f"leave {' and '.join(sorted(restarts))} out")
        self._readers = check_int(
            "readers_per_process", hosts if readers_per_process is None else readers_per_process,
            low=1, remedy=f"readers a process, a multiple of {named}, e.g. 8")
        if self._readers % hosts:
            raise ConfigError(
                f"readers_per_process: expected a multiple of {named} ({hosts}), got "
                f"{self._readers}; each worker hosts the same number of readers (a state "
                f"restores into any worker count that divides readers_per_process)")
        self._maker = StreamBatchMaker(
            given, batch_size=batch_size, seed=seed, process_index=process_index,
            process_count=process_count, per_process=self._readers,
            record_transforms=record_transforms, batch_transforms=batch_transforms,
            mask_key=None if num_epochs is None else mask_key)
        # What peek() and load_state_dict() copy: a maker no thread runs (the device-put
        # thread may be making a batch with self._maker, changing it as a copy reads it)
        self._pristine = pristine(self._maker)
        weakref.finalize(self, self._maker.close)  # (a loader let go without close(): its
        # readers' files closed, not left to the collector's "unclosed file" warnings)
        self._until: list[int] | None = None  # a pass: the epoch each reader stops before
        self._ended = False  # whether the pass _until was seen to end (by every process)
        self._progress = Progress("StreamLoader", where=where_of(self))
        self._progress.label = label("StreamLoader", given, batch_size)
        self._pairing = Pairing("StreamLoader", self)  # (its iter()s: sharding.pairing)
        self._votes: PassVotes | None = None  # (an iter()'s on its pass's end: pass_votes)
        self._base: list[dict] = self._maker.initial_states()  # as of step _base_step
        self._base_step = 0
        self._reports: dict[int, dict] = {}
        self._filing = threading.RLock()  # (_fold's)
        self._filing_now = False  # whether a fold runs (on the thread holding _filing)
        self._active: IteratorWork | None = None
        self._engine = self._start_engine(self._maker, worker_init_fn, workers)

    def _reads(self) -> str:
        return repr(self._stream)

    def _worker_counts(self) -> list[int]:
        """The worker counts that can host this process's readers: those dividing them."""
        return [n for n in range(1, self._readers + 1) if self._readers % n == 0]

    def __iter__(self) -> LoaderIterator[BatchT]:
        """The stream's batches from the position on (endless, or to the pass's end)."""
        self._progress.check()
        self._check_placement()
        self._invalidate()
        say_new_pass(self._progress, self.num_epochs)
        put = self._putter
        hosts, votes = published(self)  # (the other processes: settings, a pass's votes)
        self._votes = votes
        if self.num_epochs is not None:  # (asked of the processes, at an iter() they all make,
            generation = self._progress.generation
            gone = lambda: generation != self._progress.generation  # noqa: E731
            try:  # (once their settings are compared: no vote waits on one made otherwise)
                until = passes.pass_of(
                    *self._states_now()[1:], self.num_epochs, self.process_count,
                    None if self._probing else hosts or True, None if votes is None else
                    functools.partial(votes.ask, step="start", gone=gone), gone)
            except Stopped:  # (closed or restored from another thread while it waited)
                self._progress.check()
                raise JaxloaderError(
                    "iter() was left: iter() or load_state_dict() was called from another "
                    "thread while it waited for the other processes; call iter() again") from None
            say_later_pass(self._progress, self.num_epochs, min(until) - self.num_epochs,
                           self._ended and not self._probing)  # (a loop over passes: said once)
            self._until, self._ended = until, False  # (an ended pass: until is the next's)
        active = LoaderIterator(self._progress, self._progress.step, None, ReaderRuns(self),
                                put, cast(int, self._options.device_prefetch),  # (an int, checked)
                                single_device=put is not None and put.single_device,
                                ends_before=self._filed if self._until is None else
                                functools.partial(self._ends, self._progress.generation),
                                monitor=self._monitor, hosts=hosts,
                                failed=None if votes is None else votes.failed)
        self._active = active.work  # (not the iterator, which holds this loader: no cycle)
        return active._start()  # its work held first: a Ctrl-C in _start() leaves it to _invalidate

    def _filed(self, step: int) -> bool:
        """Files in the reports before ``step`` at times (asked a step, on the consumer's
        thread; an endless run kept one a step till a ``state_dict()``); no end: ``False``."""
        if step % 64 == 0:
            self._fold(step)
        return False

    def _ends(self, generation: int, step: int) -> bool:
        """Whether the pass ends before ``step``: every reader of every process has handed
        out its last record (asked on the consumer's thread, where a collective is safe;
        each process asks at every step of a pass, so they ask alike). Kept as the pass's
        end where the run of ``generation`` is still the loader's (not a stale one's)."""
        assert self._until is not None
        votes = None if self._votes is None else functools.partial(  # (names one that failed)
            self._votes.ask, step=step, gone=lambda: generation != self._progress.generation)
        done = passes.everywhere(all(passes.done(self._fold(step), self._until)),  # (a profile,
                                 1 if self._probing else self.process_count, votes)  # one
        # process's: its own readers, not a collective the others never join)
        if generation == self._progress.generation:  # (no call between the test and the set)
            self._ended = done
        return done

    def peek(self) -> BatchT:
        """The batch the next ``next()`` gives, made in this process; the position stays.

        Example:
            >>> import jaxloader as jl
            >>> stream = jl.Stream.from_generator(lambda i: ({"x": j} for j in range(9)), 1)
            >>> with jl.StreamLoader(stream, batch_size=3, process_index=0,
            ...                      process_count=1) as loader:
            ...     loader.peek()["x"].tolist(), next(iter(loader))["x"].tolist()
            ([0, 1, 2], [0, 1, 2])
        """
        self._check_placement()
        self._progress.check()
        batch, _ = cast(tuple, at_step(self, made_here))  # (the next batch's states: kept)
        return batch if self._putter is None else self._putter(batch)

    def _release(self, idle: bool) -> None:
        """Closes the shards this process's readers have open (``num_workers=0``), unless a
        device-put thread still makes a batch from them (they close when the loader goes)."""
        if idle:
            self._maker.close()

    # -- state ------------------------------------------------------------------------------
    def _config(self) -> dict[str, Any]:
        return {"kind": "stream", "seed": self._maker.seed, "batch_size": self.batch_size,
                "process_count": self.process_count, "readers_per_process": self._readers,
                "stream": self._stream.describe()}

    def _named(self) -> list[str]:
        self._transforms_named = self._transforms_named or transforms_of(self._transforms)
        return self._transforms_named

    def state_dict(self) -> dict[str, Any]:
        """This process's position: the step and each of its readers' state; JSON-ready.

        Example:
            >>> import jaxloader as jl
            >>> def make():
            ...     stream = jl.Stream.from_generator(lambda i: ({"x": j} for j in range(9)), 1,
            ...                                       shuffle_window=3)
            ...     return jl.StreamLoader(stream, batch_size=2, seed=0, process_index=0,
            ...                            process_count=1)
            >>> with make() as loader:
            ...     it = iter(loader); _ = next(it)
            ...     state = loader.state_dict()
            ...     state["step"], next(it)["x"].tolist()
            (1, [0, 3])
            >>> with make() as again:  # (another run: the same batch)
            ...     again.load_state_dict(state)
            ...     next(iter(again))["x"].tolist()
            [0, 3]
        """
        self._check_placement()
        step, readers, until, ended = self._states_now()
        extra = self._stream.extra_state()  # a mixture's weights
        return copied({  # the caller's own (a list edited in it leaves the loader's alone)
            "version": STATE_VERSION, "step": step, "readers_step": step,
            "process_index": self.process_index,
            **self._config(), **extra, "readers": readers,
            **passes.to_state(until, self.num_epochs, ended), "transforms": self._named(),
            **({"generators": codes} if (codes := codes_of(self._stream.shards)) else {})})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from ``state``; live iterators of this loader stop being valid. A state
        of another stream, seed, batch size or reader count is refused, naming what differs
        (``StateDictError``). Example: ``state_dict``'s."""
        self._progress.check()  # (broken or closed: it moved, and no iterator would go on)
        self._check_placement()
        config = self._config()
        state = as_written_now(state, config["stream"], self._stream.describe)
        readers = check_stream_state(state, config, self.process_index,
                                     self._stream.extra_state(), self._readers)
        warn_changed_transforms(state.get("transforms"), self._named(), state["step"],
                                lambda: older_transforms_of(self._transforms))
        warn_changed_generators(state.get("generators"), codes_of(self._stream.shards),
                                state["step"], lambda: older_codes_of(self._stream.shards))
        self._stream.check_extra_state(state, state["step"])
        until = passes.from_state(state, self.num_epochs)  # (checked before anything changes)
        opened = readers  # each opened in its pass (where a mixture reads its next record)
        if self.num_epochs is not None and all(type(r.get("epoch")) is int for r in readers):
            opened = passes.stopping_at(readers, until or passes.stops_of(readers, self.num_epochs))
        probe = copy.deepcopy(self._pristine)  # each state checked by opening it, on copies
        for i, r in enumerate(opened):
            reader = probe.reader_for(i)
            try:
                reader.reset(copied(r))
            finally:
                reader.close()  # (its files: a state checked leaves none open)
        step, base, ended = int(state["step"]), copied(readers), passes.ended(state, until)
        self._invalidate()
        # The pass the state was in (None: its readers' states say), the step, and the readers'
        # states as of it, set in one statement with no call inside: a Ctrl-C lands before or
        # after, never between (a step with another step's readers: wrong batches, silently).
        with self._filing:  # (after _invalidate(), whose device-put thread may wait for it)
            self._until, self._ended, self._progress.step, self._base, self._base_step, \
                self._reports = until, ended, step, base, step, {}
        self._progress.at_pass_end = f"{self.num_epochs} more epoch(s) of its readers" if ended or (
            until and self.process_count == 1 and all(passes.done(readers, until))) else ""

