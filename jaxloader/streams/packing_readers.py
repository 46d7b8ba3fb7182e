"""The readers of a ``PackedStream`` (``streams.packed``, whose docstring draws their states):
``PackedReader`` lays records end to end, ``FitPackedReader`` packs whole records window by
window; both over one reader of the stream under them.

Example:
    >>> import numpy as np
    >>> from jaxloader.streams.packed import PackedStream
    >>> from jaxloader.streams.reader import Stream
    >>> docs = Stream.from_generator(lambda i: ({"t": np.arange(1, n + 1)} for n in (3, 4)),
    ...                              shards=1)
    >>> packed = PackedStream(docs, "t", 5)
    >>> reader = packed.reader(reader=0, readers=1, seed=0, batch_size=1)
    >>> reader.reset(None); reader.next()["t"].tolist()  # (packed: the PackedStream)
    [1, 2, 3, 1, 2]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxloader.base.errors import JaxloaderError, RecordError, StateDictError
from jaxloader.streams.shard_state import copied, crossings_of, mark_of
from jaxloader.plans import packing as packing_plan
from jaxloader.plans.packed_rows import PackedRows
from jaxloader.streams.origins import described
from jaxloader.streams.packing_checks import check_aligned, tokens_of, warn_truncated

EMPTY_RUN = 100_000  # records in a row with no tokens before a reader gives up
_ONE_WINDOW = 1 << 62  # fit's window for all of a window's pieces (split records give more)


class _PackingReader:
    """What the two packing readers share: the state (the inner reader's place before what
    the next row is made of, and how much of that is given: ``_FIELD``), the end of a pass."""

    _FIELD: str
    packed: Any
    inner: Any
    reader: int
    _before: dict | None  # the inner state before what the reader holds
    _mark: Any = None  # (where it was taken: shard_state.mark_of)
    _until: dict = {}  # (a pass) {"until": the epoch it stops before}, as reset

    def _holds(self) -> bool:
        """Whether the reader holds what its next row is made of (a record, a window)."""
        raise NotImplementedError

    def _given(self) -> int:
        """How much of what it holds is in rows given (tokens, rows)."""
        raise NotImplementedError

    def _read_ahead(self) -> None:
        """Reads what the next row is made of; ``StopIteration`` at the end of a pass."""
        raise NotImplementedError

    def _drop(self) -> None:
        """Holds nothing (what it held is given, or read again from before it)."""
        raise NotImplementedError

    def initial_state(self) -> dict:
        return _state(self.reader, self.inner.initial_state(), self._FIELD, 0)

    def get_state(self) -> dict:
        if not self._holds():
            return _state(self.reader, self.inner.get_state(), self._FIELD, 0)
        # the epoch is the inner reader's after what it holds (the held record's; a window's
        # last: one pass either way), not the inner place's before it, the end of the epoch
        # before where the record starts the next: a pass there counts the next (from_state)
        inner = self._replay()
        held = self.inner.get_state().get("epoch") if "epoch" in inner else None
        return _state(self.reader, inner, self._FIELD, self._given(), held)

    def _replay(self) -> dict:
        """The inner state before what it holds, where it leaves each shard (``Crossings``)."""
        assert self._before is not None  # (read with what it holds)
        return crossings_of(self.inner, copied(self._before), self._mark)

    def changes_due(self, step: int) -> bool:
        """Whether the reader under it changes what it reads at ``step``."""
        return self.inner.changes_due(step)

    def begin_step(self, step: int) -> None:
        """Tells the inner reader (a mixture starts its weight changes here). What ``has_next``
        read ahead for the next row, none of it given yet, is not in the state: read before a
        change that starts now, it is put back and read again after, where a restore reads
        it (from the inner place before it)."""
        if self._holds() and not self._given() and self.inner.changes_due(step):
            self.inner.reset({**self._replay(), **self._until})
            self._drop()
        self.inner.begin_step(step)

    def has_next(self) -> bool:
        """Whether a row is left in the pass (what it is made of is read if none is held; the
        state then names the same place)."""
        if not self._holds():
            try:
                self._read_ahead()
            except StopIteration:
                return False
        return True

    def last_records(self) -> list:
        """What pads the batches of a pass that has ended: a row of padding (``value``, and
        segment ids 0), the same after a restore."""
        return [self._blank().fields()]

    def _blank(self) -> _Row:
        """A row, padding (``value``, and segment ids 0) until placed."""
        return _Row(self.packed)

    def close(self) -> None:
        self.inner.close()


class PackedReader(_PackingReader):
    """One reader's packed rows over ``inner`` (a ``StreamReader`` or ``MixedReader``): the
    same protocol (``initial_state``, ``reset``, ``next``, ``get_state``, and in a pass
    ``has_next``, ``last_records``)."""

    _FIELD = "skip"

    def __init__(self, packed: Any, inner: Any) -> None:
        self.packed, self.inner, self.reader = packed, inner, inner.reader
        self._tokens: list[np.ndarray] | None = None  # the record the next row starts in (a
        # sequence a key, as long as each other)
        self._before: dict | None = None  # the inner state before that record
        self._skip = 0  # its tokens already in rows

    def reset(self, state: dict | None) -> None:
        state = _opened(self, state, "skip")
        self._drop()
        if state["skip"]:
            self._read_record()
            assert self._tokens is not None
            if state["skip"] >= len(self._tokens[0]):
                raise StateDictError(
                    f"packed stream state: {state['skip']} tokens of a record of "
                    f"{len(self._tokens[0])} already in rows; not this stream's (or its "
                    "tokenize changed)")
            self._skip = state["skip"]

    def _holds(self) -> bool:
        return self._tokens is not None

    def _drop(self) -> None:
        self._tokens, self._before, self._skip = None, None, 0

    def _given(self) -> int:
        return self._skip

    def next(self) -> dict[str, np.ndarray]:
        """The next row; in a pass, the last one is cut short (padded) where the pass's
        tokens end, and ``StopIteration`` follows."""
        width = self.packed.length
        row = self._blank()
        filled, segment = 0, 0
        while filled < width:
            if self._tokens is None:
                try:
                    self._read_record()
                except StopIteration:  # the pass's last tokens: a short row, or none
                    if not filled:
                        raise
                    break
            assert self._tokens is not None
            n = min(width - filled, len(self._tokens[0]) - self._skip)
            segment += 1
            row.place(slice(filled, filled + n),
                      [t[self._skip:self._skip + n] for t in self._tokens], segment)
            filled += n
            self._skip += n
            if self._skip == len(self._tokens[0]):
                self._tokens, self._before, self._skip = None, None, 0
        return row.fields()

    def _read_record(self) -> None:
        """The next record with tokens: its tokens, and the inner state before it."""
        before, mark = self.inner.get_state(), mark_of(self.inner)
        self._tokens, self._skip = _next_tokens(self.packed, self.inner), 0
        self._before, self._mark = before, mark

    _read_ahead = _read_record


class FitPackedReader(_PackingReader):
    """One reader's rows of whole records (``method="best_fit"`` or ``"first_fit"``), packed
    window by window: the same protocol as ``PackedReader``."""

    _FIELD = "row"

    def __init__(self, packed: Any, inner: Any) -> None:
        self.packed, self.inner, self.reader = packed, inner, inner.reader
        self._records: list[list[np.ndarray]] = []  # the window's tokens, record by record
        self._plan: packing_plan.PackingPlan | None = None  # None: no window read yet
        self._before: dict | None = None  # the inner state before the window
        self._row = 0  # the window's rows already given

    def reset(self, state: dict | None) -> None:
        state = _opened(self, state, "row")
        self._drop()
        if state["row"]:
            self._read_window()
            assert self._plan is not None
            if state["row"] >= self._plan.rows:
                raise StateDictError(
                    f"packed stream state: {state['row']} rows of a window packed into "
                    f"{self._plan.rows} already given; not this stream's (or its tokenize "
                    "changed)")
            self._row = state["row"]

    def _holds(self) -> bool:
        return self._plan is not None

    def _drop(self) -> None:
        self._plan, self._records, self._before, self._row = None, [], None, 0

    def _given(self) -> int:
        return self._row

    def next(self) -> dict[str, np.ndarray]:
        """The window's next row (a window is read and packed when none is held);
        ``StopIteration`` at the end of a pass."""
        if self._plan is None:
            self._read_window()
        plan = self._plan
        assert plan is not None
        row = self._blank()
        first, last = int(plan.row_ptr[self._row]), int(plan.row_ptr[self._row + 1])
        segments = zip(plan.record[first:last].tolist(), plan.record_offset[first:last, 0]
                       .tolist(), plan.row_offset[first:last, 0].tolist(),
                       plan.length[first:last, 0].tolist())
        for segment, (record, begin, at, n) in enumerate(segments, 1):
            row.place(slice(at, at + n), [t[begin:begin + n] for t in self._records[record]],
                      segment)
        self._row += 1
        if self._row == plan.rows:  # the window is used up: the next row starts the next
            self._drop()
        return row.fields()

    def _read_window(self) -> None:
        """The next ``window`` records with tokens (at the end of a pass, those left;
        ``StopIteration`` if none), and their plan."""
        packed = self.packed
        before, mark = self.inner.get_state(), mark_of(self.inner)
        records: list[list[np.ndarray]] = []
        try:
            while len(records) < packed.window:  # (copies: a tokenize or shard that fills
                # one buffer again would change the records the window holds, without a word)
                records.append([np.array(t) for t in _next_tokens(packed, self.inner)])
        except StopIteration:
            if not records:
                raise
        self._before, self._mark, self._records = before, mark, records
        warn_truncated(packed, [len(t[0]) for t in records])
        self._plan = packing_plan.fit(
            np.array([len(t[0]) for t in self._records], np.int64), [packed.length],
            method=packed.method, bins=packed.bins, window=_ONE_WINDOW,
            overlong=packed.overlong, seed=None)
        self._row = 0

    _read_ahead = _read_window


def _state(reader: int, inner: dict, field: str, count: int, held: int | None = None) -> dict:
    """A packing reader's state: the inner reader's place, ``field`` (tokens or rows of it
    given) and, over a ``Stream``, the epoch (what a pass that ends counts:
    ``jaxloader.streams.passes``; a mixture's components each have their own): the held
    record's, ``held``, where given, else the inner place's."""
    epoch = {"epoch": inner["epoch"] if held is None else held} if "epoch" in inner else {}
    return {"reader": reader, **epoch, "inner": inner, field: count}


def _opened(reader: _PackingReader, state: dict | None, field: str) -> dict:
    """``state`` (``None``: the reader's first) checked as the reader's, with ``field`` a
    count; the inner reader reset to the place it names (told the epoch a pass stops
    before, ``until``, if the state has one)."""
    state = reader.initial_state() if state is None else state
    if (not isinstance(state, dict) or not isinstance(state.get("inner"), dict)
            or type(state.get(field)) is not int or state[field] < 0):
        raise StateDictError(f"packed stream state: expected {{reader, inner: the stream's "
                             f"state, {field}: a non-negative int}}, got {state!r:.200}")
    if state.get("reader") != reader.reader:
        raise StateDictError(f"packed stream state: it is reader {state.get('reader')}'s, "
                             f"handed to reader {reader.reader}")
    inner = copied(state["inner"])
    reader._until = {"until": state["until"]} if "until" in state else {}
    inner.update(reader._until)
    reader.inner.reset(inner)
    return state


def _next_tokens(packed: Any, inner: Any) -> list[np.ndarray]:
    """The tokens of ``inner``'s next record that has any (passing over those without), a
    sequence for each of ``packed``'s keys."""
    keys, tokenize = packed.keys, packed.tokenize
    for _ in range(EMPTY_RUN):
        record = inner.next()
        try:
            if tokenize is not None:
                try:
                    record = tokenize(record)
                except JaxloaderError:
                    raise
                except Exception as e:
                    raise RecordError(f"PackedStream(tokenize) raised {type(e).__name__} on a "
                                      f"record of reader {inner.reader}: {e}") from e
            tokens = [tokens_of(record, key, dtype, key == keys[0])
                      for key, dtype in zip(keys, packed.dtypes)]
            check_aligned(packed, record, tokens)
        except RecordError as e:  # (which record of a corpus of files: its shard and place)
            origin = getattr(inner, "origin", None)
            where = "" if origin is None else described(  # " (at ...)", or why not known
                lambda: f"at {place}" if (place := origin()) else None)
            if where and e.args and isinstance(e.args[0], str):
                e.args = (e.args[0] + where, *e.args[1:])
            raise
        if len(tokens[0]):
            return tokens
    raise RecordError(  # an endless stream of them would never fill a row
        f"PackedStream: reader {inner.reader} read {EMPTY_RUN:,} records in a row with no "
        f"tokens under {keys[0]!r}; check tokenize (or the stream's records)")


class _Row:
    """A packed row of each of a ``PackedStream``'s keys, placed at the same places."""

    __slots__ = ("rows", "keys")

    def __init__(self, packed: Any) -> None:
        self.keys = packed.keys
        self.rows = [PackedRows((packed.length,), dtype, fill)
                     for dtype, fill in zip(packed.dtypes, packed.values)]

    def place(self, where: slice, pieces: list[np.ndarray], segment: int) -> None:
        for row, piece in zip(self.rows, pieces):
            row.place(where, piece, segment)

    def fields(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for row, key in zip(self.rows, self.keys):
            out.update(row.fields(key))
        return out
