"""``StreamReader``: one reader's records of a ``Stream``.

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
    >>> from jaxloader.streams.reader import Stream
    >>> stream = Stream([IterableShard(lambda: range(3), name="a"),
    ...                  IterableShard(lambda: range(10, 13), name="b")])
    >>> reader = StreamReader(stream, reader=0, readers=1)
    >>> reader.reset(None); sorted(reader.next() for _ in range(6))
    [0, 1, 2, 10, 11, 12]
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from jaxloader.base.abilities import close_of
from jaxloader.base.errors import ConfigError, JaxloaderError, JaxloaderWarning, StateDictError
from jaxloader.order.index_shuffle import IndexShuffle, splitmix64
from jaxloader.streams.refill_watch import watched
from jaxloader.streams.origins import last_origin, opened, read_failed
from jaxloader.streams.shard_state import (Crossings, checked_reader_state, copied,
                                           ends_there, left_early, plain, snapshot)

EMPTY_EPOCHS = 1000  # a reader's epochs without a record, running, before it is refused


class StreamReader:
    """Reader ``reader`` of ``readers`` of ``stream`` (a ``reader.Stream``, not imported here:
    it makes its readers): its shards, epoch after epoch, window by window."""

    def __init__(self, stream: Any, *, reader: int, readers: int, seed: int = 0) -> None:
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
        try:  # (the window read again leaves its shards where the saved one did: Crossings)
            self._fill()
        except StopIteration:
            self._window_epoch = -1
        if self._window_epoch != state["epoch"] and (state["shard"], state["shard_state"],
                                                     emitted) != (0, None, 0):
            raise self._window_gone(state)  # (a saved window held a record: read again, none,
        # it went on to the next epoch or ended; an epoch's start, none read, may: its shards
        # dealt empty, as a fresh reader goes on)
        if emitted > len(self._window):
            raise StateDictError(f"stream state: {emitted} records of a window of "
                                 f"{len(self._window)} handed out; not this stream's")
        self._emitted = emitted

    def _window_gone(self, state: dict) -> StateDictError:
        """The refusal of a state whose window, read again, holds no record: its shard ends
        where the window started (a generator that now makes fewer records; an edited state)."""
        at = state["shard"]
        name = (self.stream.shards[self._mine[at]].name if at < len(self._mine)
                else f"none (shard {at} of the reader's {len(self._mine)})")
        return StateDictError(
            f"stream state: reader {self.reader}'s window of epoch {state['epoch']} starts in "
            f"shard {name} at {state['shard_state']!r}, where reading it again gives no "
            "record: the shard holds fewer records than when the state was saved (a "
            "generator's shard must make the same records each time), or the state was "
            "edited; restore over the stream it was saved with, or start the loader afresh")

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


def no_records(reader: int, epoch: int, in_pass: bool, stream: Any, dealt: list[int],
               epochs: int, every: bool) -> ConfigError:
    """Stream reader ``reader``'s refusal to go on: the shards of ``stream`` dealt to it
    (``dealt``, the last epoch's: ``epoch``) held no record in ``epochs`` epochs running
    (``every``: all the stream's shards, in them), where another epoch would not help
    (``in_pass``: its last batches are padded with its records)."""
    names = [stream.shards[i].name for i in dealt]
    if every:
        why = (f"in any of the stream's {len(stream.shards)} shards, each dealt to it in the "
               f"{epochs} epoch(s) up to epoch {epoch}")
    elif in_pass:
        why = (f"in epoch {epoch}, in a pass that ends (num_epochs, whose last batches are "
               "padded with its records, or a mixture's stopping_strategy other than the "
               "default, whose components' epochs end it); it was dealt")
    elif not stream.shuffle_shards:
        why = (f"in epoch {epoch}, and with shuffle_shards=False every epoch deals it the "
               "same")
    else:
        why = f"in {epochs} epochs running, up to epoch {epoch}, the last dealt"
    shown = ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")
    remedy = ("give the stream shards that hold records" if every else "remove the empty "
              "shards (a 0-byte JSONL or text file, as Spark writes them, or a tar archive of "
              "no members), or use fewer readers")
    return ConfigError(f"stream reader {reader}: no records {why} shards [{shown}]; "
                       f"{remedy}")
