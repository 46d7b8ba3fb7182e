"""``Stream`` (shards and how they are read) and ``StreamReader`` (one reader's records).

::

    readers R = process_count x max(1, num_workers); reader r = process_index * W + worker
    epoch e of reader r: shards in order shuffle(seed, e), every R-th from the r-th
    records ──> windows of `shuffle_window` records, each permuted by (seed, r, e, window k)
    state of a reader: {reader, epoch, shard, shard_state, window, emitted[, crossed[_files]]}
        (shard, shard_state): where the current window starts; emitted: records of it handed
        out; crossed: where it left each shard, and the files it entered (Crossings). A
        restore reopens the shard there, reads the window again (each file checked unchanged)
        and skips `emitted`: nothing lost, nothing repeated, the state a few numbers.

Each reader runs through its own epochs without end (a batch may hold the end of one epoch and
the start of the next; an epoch whose shards hold no record is passed over), or up to the
epoch a pass stops before (``until``; there an empty epoch is refused: a pass's last batches
are padded with its records). Readers in one process read their own copies of the shards (each
may be in another epoch). The order is fixed for a given ``(seed, process_count, num_workers)``;
fewer shards than readers is refused as the loader is made.

Example:
    >>> from jaxloader.streams.iterable_shards import IterableShard
    >>> stream = Stream([IterableShard(lambda: range(3)), IterableShard(lambda: range(10, 13))])
    >>> reader = StreamReader(stream, reader=0, readers=1)
    >>> reader.reset(None); sorted(reader.next() for _ in range(6))
    [0, 1, 2, 10, 11, 12]
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from jaxloader.base.abilities import OLDER, close_of
from jaxloader.base.checks import check_bool, check_int, check_keywords
from jaxloader.base.errors import ConfigError, JaxloaderError, JaxloaderWarning, StateDictError
from jaxloader.order.index_shuffle import IndexShuffle, splitmix64
from jaxloader.sources.paths import expand, path_names
from jaxloader.streams.compressed import or_compressed
from jaxloader.streams.huggingface import is_iterable_dataset, shards_of
from jaxloader.streams.refill_watch import watched
from jaxloader.streams.iterable_shards import generator_shards, mapped_shards, warn_same_names
from jaxloader.streams.origins import last_origin, opened, read_failed
from jaxloader.streams.shard_state import (Crossings, checked_reader_state, copied,
                                           ends_there, left_early, plain, snapshot)
from jaxloader.streams.shards import JsonlShard, Shard, TextShard, no_records
from jaxloader.streams.tar import TarShard

EMPTY_EPOCHS = 1000  # a reader's epochs without a record, running, before it is refused
_OPTIONS = ("shuffle_window", "shuffle_shards")  # what Stream's class methods hand Stream()


class Stream:
    """Shards read in sequence, each reader taking its share of them every epoch.

    Args:
        shards: objects following the ``Shard`` protocol (``jaxloader.streams.shards``).
        shuffle_window: records permuted together (0 or 1: the shards' own order); each
            reader holds one window in memory.
        shuffle_shards: reorder the shards every epoch (by the loader's seed).

    Example:
        >>> import jaxloader as jl
        >>> stream = jl.Stream.from_generator(lambda shard: range(shard * 10, shard * 10 + 3),
        ...                                   shards=4)
        >>> len(stream.shards), stream.shards[1].name
        (4, '<lambda>[1]')
    """

    def __init__(self, shards: Sequence[Shard], *, shuffle_window: int = 0,
                 shuffle_shards: bool = True) -> None:
        shards = list(shards) if isinstance(shards, Iterable) else [shards]  # (one: a list)
        if not shards:
            raise ConfigError("Stream(shards): expected at least one shard, got none")
        for i, shard in enumerate(shards):
            if not isinstance(shard, Shard):
                raise ConfigError(
                    f"Stream(shards)[{i}]: expected a shard (reset(state), next(), "
                    f"get_state(), name), got {type(shard).__name__}; wrap an iterable in "
                    "IterableShard(lambda: ...), or use Stream.jsonl/text/tar/from_generator"
                )
        shuffle_window = check_int("Stream(shuffle_window)", shuffle_window, low=0,
                                   remedy="records permuted together; 0 keeps the shards' order")
        self.shards = shards
        warn_same_names(shards)  # (a state names shards by name: two '<lambda>'s, told)
        self.shuffle_window = max(1, shuffle_window)
        self.shuffle_shards = check_bool("Stream(shuffle_shards)", shuffle_shards)

    def __repr__(self) -> str:
        names = [getattr(s, "name", type(s).__name__) for s in self.shards[:3]]
        more = f", ... ({len(self.shards) - 3} more)" if len(self.shards) > 3 else ""
        window = f"; shuffle_window={self.shuffle_window}" if self.shuffle_window > 1 else ""
        return f"Stream({len(self.shards)} shards: {', '.join(map(str, names))}{more}{window})"

    @classmethod
    def jsonl(cls, paths: Any, *, append_only: bool = False, **kwargs: Any) -> "Stream":
        """A stream of JSON lines files, one shard a file. ``paths``: a path, a list, a folder
        (its ``*.jsonl`` files, and ``*.jsonl.gz``, ``.bz2``, ``.xz``, ``.zst``) or a glob
        pattern (``jaxloader.sources.paths``). Compressed files are read as what they hold
        (``jaxloader.streams.compressed``; a resume reads one up to its place). A restore
        over a file that changed since the state was saved is refused; ``append_only=True``
        accepts files that only grew (``shards.FileShard``)."""
        shards = [JsonlShard(p, append_only=append_only)
                  for p in expand(paths, or_compressed(".jsonl"), "Stream.jsonl")]
        return cls(shards, **check_keywords("Stream.jsonl", kwargs, _OPTIONS))

    @classmethod
    def text(cls, paths: Any, *, append_only: bool = False, **kwargs: Any) -> "Stream":
        """A stream of text files, a line a record (``paths`` and ``append_only`` as for
        ``jsonl``; ``*.txt``, compressed or not)."""
        shards = [TextShard(p, append_only=append_only)
                  for p in expand(paths, or_compressed(".txt"), "Stream.text")]
        return cls(shards, **check_keywords("Stream.text", kwargs, _OPTIONS))

    @classmethod
    def tar(cls, paths: Any, *, tolerate_missing_end: bool = False, append_only: bool = False,
            **kwargs: Any) -> "Stream":
        """A stream of tar shards in the WebDataset layout (``paths`` and ``append_only`` as
        for ``jsonl``; ``*.tar``, compressed or not: ``*.tar.gz``, ``*.tgz``). Every host is
        given the same list (``process_index`` deals it out). A damaged or cut shard is an
        error naming it and the member (``jaxloader.streams.tar``); ``tolerate_missing_end=True``
        accepts shards written without the end-of-archive marker."""
        shards = [TarShard(p, tolerate_missing_end=tolerate_missing_end, append_only=append_only)
                  for p in expand(paths, (*or_compressed(".tar"), ".tgz"), "Stream.tar")]
        return cls(shards, **check_keywords("Stream.tar", kwargs, _OPTIONS))

    @classmethod
    def from_generator(cls, make: Callable[[int], Iterable], shards: int,
                       **kwargs: Any) -> "Stream":
        """``shards`` shards, shard ``i`` reading ``make(i)`` (a generator function of the
        shard number; a generator object, which cannot start again, is refused); resumed by
        skipping the records already read. Each record must be new: a buffer refilled and
        yielded again is warned of (``streams.refill_watch``).

        Example:
            >>> import jaxloader as jl
            >>> def numbers(shard):
            ...     yield from range(shard * 100, shard * 100 + 3)
            >>> jl.Stream.from_generator(numbers, shards=2)
            Stream(2 shards: numbers[0], numbers[1])
        """
        return cls(generator_shards(make, shards),
                   **check_keywords("Stream.from_generator", kwargs, _OPTIONS))

    @classmethod
    def huggingface(cls, dataset: Any, **kwargs: Any) -> "Stream":
        """A Hugging Face ``datasets.IterableDataset`` (``load_dataset(..., streaming=True)``),
        a shard of it a shard, restored by the dataset's own state, list features of numbers
        as arrays (``jaxloader.streams.huggingface``). ``StreamLoader(dataset)`` reads one
        this way, with no shuffle window.

        Example (``tests/streams/test_huggingface.py`` runs it)::

            ds = datasets.load_dataset("json", data_files=files, split="train", streaming=True)
            loader = jl.StreamLoader(jl.Stream.huggingface(ds, shuffle_window=10_000),
                                     batch_size=256, num_workers=2)
        """
        return cls(shards_of(dataset), **check_keywords("Stream.huggingface", kwargs, _OPTIONS))

    def map(self, fn: Callable[[Any], Any]) -> "Stream":
        """This stream with each record passed through ``fn`` in its readers, before the
        loader's transforms: a component renamed, cast or parsed before ``jl.mix`` or
        ``jl.PackedStream`` (``sources.mapped.MapSource`` does it for a source). The shards'
        names carry the function's code, so a state saved under another function is refused.

        Example:
            >>> import jaxloader as jl
            >>> stream = jl.Stream.from_generator(lambda i: ({"x": i} for _ in range(2)),
            ...                                   shards=1)
            >>> with jl.StreamLoader(stream.map(lambda r: {"y": r["x"] + 1}), batch_size=2,
            ...                      process_index=0, process_count=1) as loader:
            ...     next(iter(loader))["y"].tolist()
            [1, 1]
        """
        return Stream(mapped_shards(self.shards, fn),
                      shuffle_window=self.shuffle_window, shuffle_shards=self.shuffle_shards)

    def reader(self, *, reader: int, readers: int, seed: int = 0,
               batch_size: int = 1) -> "StreamReader":
        """Reader ``reader`` of ``readers`` (``streams.contract``; no use of ``batch_size``)."""
        return StreamReader(self, reader=reader, readers=readers, seed=seed)

    def describe(self) -> dict[str, Any]:
        """What a state is checked against: the shards' names, the window, the shuffle. Files
        are named relative to the folder they share, as a file source's fingerprint names
        them (the same files staged at another path restore); whole, as states saved before
        2026-11-29 hold them, under ``base.abilities.OLDER``."""
        names = [s.name for s in self.shards]
        paths = [p for s in self.shards if isinstance(p := getattr(
            getattr(s, "shard", s), "path", None), str)]  # (a Stream.map's: its shard's)
        if paths and not OLDER.get():
            folder = paths[0][:len(paths[0]) - len(path_names(paths)[0])]
            names = [n[len(folder):] if folder and n.startswith(folder) else n for n in names]
        return {"shards": names, "shuffle_window": self.shuffle_window,
                "shuffle_shards": self.shuffle_shards}

    def extra_state(self) -> dict[str, Any]:
        """What a state holds beyond the readers' places: nothing (a mixture: its weights)."""
        return {}

    def check_extra_state(self, state: dict, step: int) -> None:
        """Nothing to check beyond ``describe`` (a mixture checks its earlier weights)."""


def as_stream(value: Any) -> Any:
    """``Stream.huggingface(value)`` for a ``datasets.IterableDataset``, ``value`` otherwise:
    what ``StreamLoader``, ``jl.mix`` and ``PackedStream`` take in place of a stream."""
    return Stream.huggingface(value) if is_iterable_dataset(value) else value


class StreamReader:
    """Reader ``reader`` of ``readers``: its shards, epoch after epoch, window by window."""

    def __init__(self, stream: Stream, *, reader: int, readers: int, seed: int = 0) -> None:
        if len(stream.shards) < readers:
            hf = any(type(s).__name__ == "HuggingFaceShard" for s in stream.shards)
            raise ConfigError(
                f"Stream: {len(stream.shards)} shards for {readers} readers (process_count x "
                f"readers_per_process, which defaults to num_workers): reader "
                f"{len(stream.shards)} would read nothing; give at least {readers} shards"
                + (" (a Hugging Face dataset of Parquet files: ds.reshard() makes a shard of "
                   "each row group)" if hf else " (one large file: split it, split -n l/8 "
                   "train.jsonl part-, then Stream.jsonl(sorted(glob('part-*'))); or convert it "
                   "to Parquet, read by a DataLoader)") + ", or fewer readers")
        self.stream, self.reader, self.readers, self.seed = stream, reader, readers, seed
        self._window: list = []
        self._mine: list[int] = []
        self._current: Any = None  # the open shard: this reader's copy of it
        self._until: int | None = None  # the epoch a pass ends before (None: endless)
        self._ended, self._window_epoch, self._window_key = False, 0, 0
        self._window_start: tuple = (0, None)
        self._read_from: tuple | None = None  # the window's (shards, start, crossed, order)
        self._crossings = Crossings()  # where it left each shard (a state's "crossed")
        self._previous: tuple | None = None  # the window's before it (origin() reads them)

    # -- state ------------------------------------------------------------------------------
    def initial_state(self) -> dict:
        return {"reader": self.reader, "epoch": 0, "shard": 0, "shard_state": None,
                "window": 0, "emitted": 0}

    def reset(self, state: dict | None) -> None:
        """Continues from ``state`` (``None``: the start): the window is read again. A state
        with ``"until": e`` (a pass's end, which the loader adds) reads epochs before ``e``
        only: ``next()`` then raises ``StopIteration`` at the end of epoch ``e - 1``."""
        state = self.initial_state() if state is None else checked_reader_state(
            state, self.reader)
        self._until, self._ended = state.get("until"), False
        self._crossings = Crossings(state.get("crossed"), state.get("crossed_files"))  # (the
        self._epoch, self._shard = state["epoch"], state["shard"]
        self._window_number, emitted = state["window"], state["emitted"]
        self._start_epoch(self._epoch)
        if self._shard > len(self._mine):
            raise StateDictError(f"stream state: shard {self._shard} of reader {self.reader}'s "
                                 f"{len(self._mine)} in epoch {self._epoch}; not this stream's")
        self._open(self._shard, state["shard_state"])
        self._fill()  # window read again leaves its shards where the saved one did: Crossings)
        if emitted > len(self._window):
            raise StateDictError(f"stream state: {emitted} records of a window of "
                                 f"{len(self._window)} handed out; not this stream's")
        self._emitted = emitted

    def get_state(self) -> dict:
        at, state = self._window_start  # (the shard's state as read: in JSON's types now)
        return self.crossings({
            "reader": self.reader, "epoch": self._window_epoch, "shard": at,
            "shard_state": plain(state, lambda: self.stream.shards[self._mine[at]].name),
            "window": self._window_key, "emitted": self._emitted}, self.mark())

    def mark(self) -> tuple:  # (where a state taken now starts: Crossings.mark)
        return self._crossings.mark()

    def crossings(self, state: dict, mark: tuple) -> dict:  # (see Crossings.of)
        return self._crossings.of(state, mark)

    # -- records ----------------------------------------------------------------------------
    def changes_due(self, step: int) -> bool:
        """Whether ``begin_step(step)`` changes what it reads next: never (a mixture's may)."""
        return False

    def begin_step(self, step: int) -> None:
        """Told before each batch it reads for (a mixture starts its weight changes here)."""

    def next(self) -> Any:
        """The next record; ``StopIteration`` past the end of the pass (``until``)."""
        while self._emitted >= len(self._window):
            self._fill()
        record = self._window[self._permutation[self._emitted]]
        self._emitted += 1
        return record

    origin = last_origin  # the shard and place of the record next() handed out last

    def has_next(self) -> bool:
        """Whether ``next()`` has a record (it may read the next window, as ``next()`` would)."""
        try:
            while self._emitted >= len(self._window):
                self._fill()
        except StopIteration:
            return False
        return True

    def last_records(self) -> list:
        """The records of the window last read, the last handed out first (what a pass that
        has ended pads its batches with)."""
        return [self._window[i] for i in self._permutation[::-1].tolist()]

    def _fill(self) -> None:
        """Reads the next window (within one epoch; an epoch's last window may be short);
        ``StopIteration``, the state unchanged, when the next epoch is ``until``."""
        if self._ended:
            raise StopIteration
        where = (self._window_epoch, self._window_key, self._window_start, self._epoch,
                 self._window_number, self._shard, self._crossings.since)
        empty, epochs = set[int](), 0  # the shards dealt empty in the epochs running, those
        while True:
            self._window_epoch, self._window_key = self._epoch, self._window_number
            shard = self._current if self._shard < len(self._mine) else None
            self._window_start = (self._shard, snapshot(shard) if shard else None)
            window: list = []
            crossed: list | None = None  # (shard, first) of each shard opened in the window
            cap = self._crossings.start()  # (-1, or where the saved run left this shard)
            while len(window) < self.stream.shuffle_window and self._shard < len(self._mine):
                try:
                    if len(window) == cap:
                        ends_there(self._current, cap)
                        raise StopIteration
                    window.append(self._read())
                except StopIteration:
                    if len(window) < cap:
                        raise left_early(self._current, len(window), cap) from None
                    cap = self._crossings.left(len(window))
                    self._shard += 1
                    self._crossings.opened(self._open(self._shard, None))  # (checked, restored)
                    crossed = [*(crossed or ()), (self._shard, len(window))]
            self._crossings.read(len(window))
            if window:
                break
            if self._window_number == 0:  # a whole epoch without a record: the next, unless
                empty.update(self._mine)  # in a pass, a deal that never changes, every shard
                epochs += 1  # dealt empty or EMPTY_EPOCHS running (no_records says why)
                every = len(empty) == len(self.stream.shards)
                if self._until is not None or not self.stream.shuffle_shards or every or \
                        epochs >= EMPTY_EPOCHS:
                    raise no_records(self.reader, self._epoch, self._until is not None,
                                     self.stream, self._mine, epochs, every)
            if self._until is not None and self._epoch + 1 >= self._until:
                # the pass is over: the state stays at the last window, all of it handed out
                (self._window_epoch, self._window_key, self._window_start, self._epoch,
                 self._window_number, self._shard, self._crossings.since) = where
                self._ended = True
                raise StopIteration
            self._epoch += 1  # the epoch is over: the next one
            self._window_number, self._shard = 0, 0
            self._start_epoch(self._epoch)
            self._open(0, None)
        self._window, self._emitted = window, 0
        self._window_number += 1
        n = len(window)
        if n > 1:
            key = splitmix64(self.seed ^ splitmix64(self.reader + 1) ^ splitmix64(self._epoch))
            self._permutation = IndexShuffle(n, seed=key, epoch=self._window_key)(np.arange(n))
        else:
            self._permutation = np.zeros(1, np.int64)
        self._previous, self._read_from = self._read_from, (self._mine, self._window_start,
                                                           crossed, self._permutation)

    def _read(self) -> Any:
        shard = self._current
        try:
            return shard.next()
        except (StopIteration, JaxloaderError, JaxloaderWarning):  # (the last: jaxloader's
            raise  # check made an error, not the shard's)
        except Exception as e:
            raise read_failed(shard, self.reader, self._epoch, e) from e

    def _start_epoch(self, epoch: int) -> None:
        n = len(self.stream.shards)
        order = np.arange(n, dtype=np.int64)
        if self.stream.shuffle_shards and n > 1:
            order = IndexShuffle(n, seed=self.seed, epoch=epoch)(order)
        self._mine = order[self.reader::self.readers].tolist()

    def _open(self, index: int, state: dict | None) -> Any:
        """Opens shard ``index`` of this epoch's (at ``state``) as this reader's own copy, and
        returns it (``None``: none left): readers in one process (a worker hosting several, or
        ``num_workers=0``) may read one shard at once, each in its own epoch."""
        self.close()  # (the shard left)
        if index < len(self._mine):
            shard = copy.copy(self.stream.shards[self._mine[index]])  # (reset opens its files)
            opened(shard, state if state is None else copied(state), self.reader, self._epoch)
            self._current = watched(shard)  # (its first records: a buffer refilled?)
        return self._current

    def close(self) -> None:
        """Closes the shard this reader has open."""
        shard, self._current = self._current, None
        close_of(shard)

