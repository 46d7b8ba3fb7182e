"""Packed streams: a stream's token sequences laid end to end and cut into rows of one length.

::

    a reader's records ──tokenize──> {key: 1-D tokens} ──end to end──> rows of `length`
        each piece of a record in a row is a segment: <key>_segment_ids 1..k, <key>_positions
        0.. within the piece (PackedSource's "concat" layout: every token placed exactly once)
    state of a reader: {reader, inner: the state before the record the next row starts in,
                        skip: its tokens already in rows}

A restore reopens the inner reader at ``inner``, reads that record again, tokenizes it and
skips ``skip`` tokens: nothing lost, nothing repeated, and the state stays a few numbers. The
rows are full: a stream is endless (a row may hold the end of one epoch and the start of the
next). Records with no tokens are passed over.

Example:
    >>> import numpy as np, jaxloader as jl
    >>> docs = jl.Stream.from_generator(lambda i: ({"t": np.arange(1, n + 1)} for n in (3, 4)),
    ...                                 shards=1)
    >>> loader = jl.StreamLoader(jl.PackedStream(docs, "t", 5), batch_size=1,
    ...                          process_index=0, process_count=1)
    >>> row = next(iter(loader))
    >>> row["t"].tolist(), row["t_segment_ids"].tolist(), row["t_positions"].tolist()
    ([[1, 2, 3, 1, 2]], [[1, 1, 1, 2, 2]], [[0, 1, 2, 0, 1]])
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Mapping

import numpy as np

from jaxloader.checks import check_int
from jaxloader.errors import ConfigError, JaxloaderError, RecordError, StateDictError


EMPTY_RUN = 100_000  # records in a row with no tokens before a reader gives up


class PackedStream:
    """Rows of ``length`` tokens of ``key`` packed from ``stream`` (a ``Stream``, or streams
    mixed by ``jl.mix``): each record, after ``tokenize`` (a function of the record returning
    a dict with ``key``: 1-D integer tokens; none: the records are such dicts already), is laid
    after the one before and the stream is cut every ``length`` tokens. Read it with a
    ``StreamLoader``; its ``transforms`` then apply to the rows.

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> text = jl.Stream.from_generator(lambda i: iter(["ab", "cde"]), shards=1)
        >>> as_bytes = lambda s: {"tokens": np.frombuffer(s.encode(), np.uint8)}
        >>> packed = jl.PackedStream(text, "tokens", 4, tokenize=as_bytes)
        >>> loader = jl.StreamLoader(packed, batch_size=1, process_index=0, process_count=1)
        >>> next(iter(loader))["tokens"].tolist()  # "ab" and the start of "cde"
        [[97, 98, 99, 100]]
    """

    def __init__(self, stream: Any, key: str, length: int,
                 tokenize: Callable[[Any], Mapping[str, Any]] | None = None,
                 dtype: Any = np.int32) -> None:
        from jaxloader.streams.mixed import MixedStream
        from jaxloader.streams.reader import Stream

        if not isinstance(stream, (Stream, MixedStream)):
            raise ConfigError(
                f"PackedStream(stream): expected a jl.Stream or streams mixed by jl.mix, got "
                f"{type(stream).__name__}; for a random-access source use jl.PackedSource"
            )
        if not isinstance(key, str):
            raise ConfigError(f"PackedStream(key): expected the name of the token field (a "
                              f"str), got {key!r}")
        check_int("PackedStream(length)", length, low=1, remedy="tokens a row, e.g. 2048")
        if tokenize is not None and not callable(tokenize):
            raise ConfigError(f"PackedStream(tokenize): expected a function of a record, got "
                              f"{type(tokenize).__name__}")
        if np.dtype(dtype).kind not in "iu":
            raise ConfigError(f"PackedStream(dtype): expected an integer dtype for tokens, got "
                              f"{np.dtype(dtype)}")
        self.stream, self.key, self.length = stream, key, length
        self.tokenize, self.dtype = tokenize, np.dtype(dtype)

    @property
    def shards(self) -> list:
        return self.stream.shards

    def describe(self) -> dict[str, Any]:
        """What a state is checked against: the packing and the stream under it."""
        return {"packed": self.stream.describe(), "key": self.key, "length": self.length,
                "dtype": self.dtype.str}

    def extra_state(self) -> dict[str, Any]:
        return self.stream.extra_state()

    def check_extra_state(self, state: dict, step: int) -> None:
        self.stream.check_extra_state(state, step)


class PackedReader:
    """One reader's packed rows over ``inner`` (a ``StreamReader`` or ``MixedReader``): the
    same protocol (``initial_state``, ``reset``, ``next``, ``get_state``)."""

    def __init__(self, packed: PackedStream, inner: Any) -> None:
        self.packed, self.inner, self.reader = packed, inner, inner.reader
        self._tokens: np.ndarray | None = None  # the record the next row starts in
        self._before: dict | None = None  # the inner state before that record
        self._skip = 0  # its tokens already in rows
        self._count_up = np.arange(packed.length, dtype=np.int32)  # positions in a piece

    def initial_state(self) -> dict:
        return {"reader": self.reader, "inner": self.inner.initial_state(), "skip": 0}

    def reset(self, state: dict | None) -> None:
        state = self.initial_state() if state is None else state
        if (not isinstance(state, dict) or not isinstance(state.get("inner"), dict)
                or type(state.get("skip")) is not int or state["skip"] < 0):
            raise StateDictError(f"packed stream state: expected {{reader, inner: the stream's "
                                 f"state, skip: a non-negative int}}, got {state!r:.200}")
        if state.get("reader") != self.reader:
            raise StateDictError(f"packed stream state: it is reader {state.get('reader')}'s, "
                                 f"handed to reader {self.reader}")
        self.inner.reset(copy.deepcopy(state["inner"]))
        self._tokens, self._before, self._skip = None, None, 0
        if state["skip"]:
            self._read_record()
            assert self._tokens is not None
            if state["skip"] >= len(self._tokens):
                raise StateDictError(
                    f"packed stream state: {state['skip']} tokens of a record of "
                    f"{len(self._tokens)} already in rows; not this stream's (or its tokenize "
                    "changed)")
            self._skip = state["skip"]

    def get_state(self) -> dict:
        if self._tokens is None:
            return {"reader": self.reader, "inner": self.inner.get_state(), "skip": 0}
        return {"reader": self.reader, "inner": copy.deepcopy(self._before), "skip": self._skip}

    def next(self) -> dict[str, np.ndarray]:
        width, key = self.packed.length, self.packed.key
        tokens = np.zeros(width, self.packed.dtype)
        ids = np.zeros(width, np.int32)
        positions = np.zeros(width, np.int32)
        count_up = self._count_up
        filled, segment = 0, 0
        while filled < width:
            if self._tokens is None:
                self._read_record()
            assert self._tokens is not None
            n = min(width - filled, len(self._tokens) - self._skip)
            segment += 1
            tokens[filled:filled + n] = self._tokens[self._skip:self._skip + n]
            ids[filled:filled + n] = segment
            positions[filled:filled + n] = count_up[:n]
            filled += n
            self._skip += n
            if self._skip == len(self._tokens):
                self._tokens, self._before, self._skip = None, None, 0
        return {key: tokens, f"{key}_segment_ids": ids, f"{key}_positions": positions}

    def _read_record(self) -> None:
        """The next record with tokens: its tokens, and the inner state before it."""
        key, tokenize = self.packed.key, self.packed.tokenize
        for _ in range(EMPTY_RUN):
            before = self.inner.get_state()
            record = self.inner.next()
            if tokenize is not None:
                try:
                    record = tokenize(record)
                except JaxloaderError:
                    raise
                except Exception as e:
                    raise RecordError(f"PackedStream(tokenize) raised {type(e).__name__} on a "
                                      f"record of reader {self.reader}: {e}") from e
            tokens = _tokens_of(record, key, self.packed.dtype)
            if len(tokens):
                self._tokens, self._before, self._skip = tokens, before, 0
                return
        raise RecordError(  # an endless stream of them would never fill a row
            f"PackedStream: reader {self.reader} read {EMPTY_RUN:,} records in a row with no "
            f"tokens under {key!r}; check tokenize (or the stream's records)")


def _tokens_of(record: Any, key: str, dtype: np.dtype) -> np.ndarray:
    if not isinstance(record, Mapping) or key not in record:
        got = sorted(record) if isinstance(record, Mapping) else type(record).__name__
        raise RecordError(f"PackedStream: expected a record (after tokenize) with key {key!r}: "
                          f"1-D integer tokens, got {got}; pass tokenize= to make them")
    value = record[key]
    if type(value) is not np.ndarray:
        value = np.asarray(value)
    if value.ndim != 1 or (value.size and value.dtype.kind not in "biu"):
        raise RecordError(f"PackedStream: record[{key!r}]: expected 1-D integer tokens, got "
                          f"shape {value.shape} dtype {value.dtype}")
    if value.size and not np.can_cast(value.dtype, dtype):  # (a tokenizer's int64 ids)
        info = np.iinfo(dtype)
        low, high = value.min(), value.max()
        if low < info.min or high > info.max:
            raise RecordError(f"PackedStream: record[{key!r}] holds tokens outside {dtype} "
                              f"([{low}, {high}]); pass dtype= a wider integer")
    return value
