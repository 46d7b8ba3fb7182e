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
next). Records with no tokens are passed over. A pass that ends (``StreamLoader(num_epochs=
n)``) ends with the row its last token is in, padded (0, segment id 0) after it; the state
carries the epoch of the record the next row starts in, which is what the pass counts.

``method="best_fit"`` / ``"first_fit"`` packs whole records instead, window by window::

    the next `window` records with tokens ──packing_plan.fit (bins rows open)──> the window's
        rows, given one by one; padding (0, segment id 0) where no record fitted
    state of a reader: {reader, inner: the state before the window, row: its rows given}

A restore reads the window again (``window`` records, as a shuffle window is read again) and
packs it the same way: the plan is a pure function of the window's lengths. At the end of a
pass the last window holds the records left, fewer than ``window``.

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

import warnings
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from jaxloader.base.abilities import DIGEST_LEVELS, digest_level
from jaxloader.base.checks import Int, check_int, check_one_argument
from jaxloader.base.loader_names import loader_names
from jaxloader.base.number_kinds import number_kind
from jaxloader.plans import packing as packing_plan
from jaxloader.plans.packed_rows import check_field_names, check_fill, fill_values, fills_said
from jaxloader.base.errors import ConfigError, JaxloaderWarning, user_stacklevel
from jaxloader.sources.code_digest import code_digests
from jaxloader.streams.contract import StreamLike
from jaxloader.streams.packing_readers import FitPackedReader, PackedReader


@loader_names("stream")
class PackedStream:
    """Rows of ``length`` tokens of ``key`` packed from ``stream`` (a ``Stream``, or streams
    mixed by ``jl.mix``): each record, after ``tokenize`` (a function of the record returning
    a dict with ``key``: 1-D integer tokens; none: the records are such dicts already), is laid
    after the one before and the stream is cut every ``length`` tokens (``method="concat"``,
    the default). ``"best_fit"`` or ``"first_fit"`` place whole records instead, ``bins`` rows
    open at a time, over windows of ``window`` records, as ``PackedSource`` does (``bins`` or
    ``window`` without a ``method`` is refused: concat reads neither); ``overlong`` says what
    becomes of a record longer than a row (``"split"`` into rows, or ``"truncate"``). Read it
    with a ``StreamLoader``; its ``transforms`` then apply to the rows.

    ``key`` may be a list of keys as long as each other in every record (ids, labels, a loss
    mask): each is packed at the same places, its rows of its own ``dtype`` (one, or ``{key:
    dtype}``; a float key needs a float one); other keys a record holds are not packed, and
    said once. ``value``: what the rows hold after their segments (a number, or ``{key:
    number}``: ``{"ids": 0, "labels": -100}``).

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> text = jl.Stream.from_generator(lambda i: iter(["ab", "cde"]), shards=1)
        >>> as_bytes = lambda s: {"tokens": np.frombuffer(s.encode(), np.uint8)}
        >>> packed = jl.PackedStream(text, "tokens", 4, tokenize=as_bytes)
        >>> loader = jl.StreamLoader(packed, batch_size=1, process_index=0, process_count=1)
        >>> next(iter(loader))["tokens"].tolist()  # "ab" and the start of "cde"
        [[97, 98, 99, 100]]
        >>> fitted = jl.PackedStream(text, "tokens", 4, tokenize=as_bytes, method="best_fit",
        ...                          window=2)
        >>> loader = jl.StreamLoader(fitted, batch_size=2, process_index=0, process_count=1)
        >>> next(iter(loader))["tokens"].tolist()  # whole records, 0 where none fits
        [[97, 98, 0, 0], [99, 100, 101, 0]]
    """

    def __init__(self, stream: StreamLike, key: str | Sequence[str], length: Int,
                 tokenize: Callable[[Any], Mapping[str, Any]] | None = None,
                 dtype: Any = np.int32, *,
                 method: packing_plan.Method | None = None, bins: Int = 16,
                 window: Int = 1000, overlong: packing_plan.Overlong = "split",
                 value: Any = 0) -> None:
        from jaxloader.streams.mixed import MixedStream
        from jaxloader.streams.reader import Stream, as_stream

        stream = as_stream(stream)  # a Hugging Face IterableDataset, read as a stream
        if not isinstance(stream, (Stream, MixedStream)):
            raise ConfigError(
                f"PackedStream(stream): expected a jl.Stream or streams mixed by jl.mix, got "
                f"{type(stream).__name__}; for a random-access source use jl.PackedSource"
            )
        keys = [key] if isinstance(key, str) else list(key) if isinstance(
            key, (list, tuple)) else []
        if not keys or not all(isinstance(k, str) for k in keys) or len(set(keys)) < len(keys):
            raise ConfigError(f"PackedStream(key): expected the name of the token field (a "
                              f"str), or a list of names of fields as long as it, got {key!r}")
        check_field_names("PackedStream(key)", keys)
        length = check_int("PackedStream(length)", length, low=1, remedy="tokens a row, e.g. 2048")
        if tokenize is not None and not callable(tokenize):
            raise ConfigError(f"PackedStream(tokenize): expected a function of a record, got "
                              f"{type(tokenize).__name__} {tokenize!r:.60}")
        if tokenize is not None:
            check_one_argument("PackedStream(tokenize)", tokenize, "tokenize(record)")
        self.dtypes = _dtypes(dtype, keys)
        bins = check_int("PackedStream(bins)", bins, low=1, remedy="rows open at a time, e.g. 16")
        window = check_int("PackedStream(window)", window, low=1,
                           remedy="records packed together, e.g. 1000")
        chosen = packing_plan.method_of("PackedStream", method, bins, window, 1000)
        packing_plan.check_method("PackedStream(method)", chosen)
        packing_plan.check_overlong("PackedStream(overlong)", overlong, chosen)
        self.stream, self.keys, self.length = stream, keys, length
        self.key, self.dtype = keys[0], self.dtypes[0]  # (the first: the tokens)
        self.values = fill_values("PackedStream(value)", value, keys)
        for k, fill, kind in zip(keys, self.values, self.dtypes):
            check_fill("PackedStream(value)", k, fill, kind)
        self.tokenize = tokenize
        self.left_out_looks = 0  # (records looked at for keys left out: streams.packing_checks)
        self.said_truncated = False  # (records cut by overlong="truncate" said: the same)
        self._tokenize_digests = (None,) * (DIGEST_LEVELS + 1) if tokenize is None else (
            tuple(d[:16] for d in code_digests(tokenize)))  # (as made: a memo it fills is
        # not another function; and as versions of 2026-11-30 took it, digest_level)
        self.method, self.bins, self.window, self.overlong = chosen, bins, window, overlong
        changes = sorted(getattr(stream, "schedule", {0: None}))[1:]  # (a mixture's)
        if changes and chosen != "concat":
            warnings.warn(
                f"PackedStream(method={chosen!r}) over streams mixed with weight changes (from "
                f"step {changes[0]}): a reader packs a window of {window:,} records read ahead "
                "of the rows it hands out, so a change reaches the batches only with the next "
                "window, up to a window's rows after its step (hundreds of steps with rows of "
                "a few documents); pass a smaller window= for a change nearer its step, or "
                "method='concat' (a change at its step)", JaxloaderWarning,
                stacklevel=user_stacklevel())

    def __repr__(self) -> str:
        keys = self.key if len(self.keys) == 1 else self.keys
        return (f"PackedStream({self.stream!r}, {keys!r}, {self.length}, "
                f"method={self.method!r})")

    @property
    def shards(self) -> list:
        return self.stream.shards

    def describe(self) -> dict[str, Any]:
        """What a state is checked against: the packing and the stream under it."""
        described = {"packed": self.stream.describe(), "key": self.key, "length": self.length,
                     "dtype": self.dtype.str}
        if len(self.keys) > 1:  # (a state of one key's stays as it was)
            described.update(keys=self.keys, dtypes=[d.str for d in self.dtypes])
        if self.method != "concat":  # (a state saved before fitting existed stays valid)
            described.update(method=self.method, bins=self.bins, window=self.window,
                             overlong=self.overlong)
        # (a function of the data, as Stream.map's; None too: a state saved without one is
        # refused under one)
        described["tokenize"] = self._tokenize_digests[digest_level()]
        if (fills := fills_said(self.values)) is not None:  # (the rows' padding)
            described["value"] = fills
        return described

    def reader(self, *, reader: int, readers: int, seed: int,
               batch_size: int) -> PackedReader | FitPackedReader:
        """The packing reader (``streams.packing_readers``) over reader ``reader`` of
        ``readers`` of the stream under it (``streams.contract``)."""
        inner = self.stream.reader(reader=reader, readers=readers, seed=seed,
                                   batch_size=batch_size)
        return PackedReader(self, inner) if self.method == "concat" else FitPackedReader(
            self, inner)

    def extra_state(self) -> dict[str, Any]:
        return self.stream.extra_state()

    def check_extra_state(self, state: dict, step: int) -> None:
        self.stream.check_extra_state(state, step)


def _dtypes(dtype: Any, keys: list[str]) -> list[np.dtype]:
    """Each key's dtype, from ``dtype``: one for all, or ``{key: dtype}`` (the tokens' then
    ``np.int32`` where left out), numbers all (integers for the tokens, the first key)."""
    given = dtype if isinstance(dtype, Mapping) else dict.fromkeys(keys, dtype)
    if set(given) - set(keys):
        raise ConfigError(f"PackedStream(dtype): a dtype for keys not packed "
                          f"{sorted(map(str, set(given) - set(keys)))}; the keys are {keys}")
    out = []
    for i, key in enumerate(keys):
        named = given.get(key, np.int32)
        try:
            kind: str = number_kind(np.dtype(named))  # (bfloat16: a float)
        except TypeError:  # (a name NumPy does not know: 'int33')
            kind = ""
        if kind not in (("i", "u") if i == 0 else ("b", "i", "u", "f")):
            raise ConfigError(
                f"PackedStream(dtype): expected an integer dtype for tokens (np.int32, "
                f"'uint16'){', a number dtype for the keys after' if len(keys) > 1 else ''}, "
                f"got {np.dtype(named) if kind else repr(named)[:80]}"
                + (f" for {key!r}" if len(keys) > 1 else ""))
        out.append(np.dtype(named))
    return out
