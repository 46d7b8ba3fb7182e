"""``PackedSource``: variable-length token sequences packed into fixed-length rows.

::

    source (records {key: 1-D tokens, ...}) ──lengths──> plan (packing_plan: pure function)
    packed row r = segments plan.row_ptr[r]:row_ptr[r+1] ──> per key:
        key              (L,)  tokens, 0 on padding
        key_segment_ids  (L,)  1..k for the row's k segments, 0 on padding
        key_positions    (L,)  0.. within each segment

The packed rows are an ordinary source (``len`` rows, random access), so the loader shuffles,
shards, resumes and spreads them over workers as any other: a batch is a pure function of
``(seed, epoch, step)`` and a restore is O(1) and elastic, with no record lost or read twice.
The plan is computed once, from the records' lengths (a ``RaggedSource`` knows them, a
``ParquetSource`` reads its list column's offsets; otherwise
one pass reads them, and ``lengths="file.npy"`` keeps them next to the data). Records are
placed in an order shuffled by ``seed`` (the same rows every epoch; the loader reorders the
rows each epoch). Keys not packed are left out of the rows.

Example:
    >>> import numpy as np, jaxloader as jl
    >>> docs = jl.RaggedSource.from_sequences({"tokens": [[1, 2, 3], [4, 5], [6, 7, 8, 9]]})
    >>> packed = jl.PackedSource(docs, "tokens", 5, method="first_fit", seed=None)
    >>> row = packed[0]
    >>> row["tokens"].tolist(), row["tokens_segment_ids"].tolist(), row["tokens_positions"].tolist()
    ([1, 2, 3, 4, 5], [1, 1, 1, 2, 2], [0, 1, 2, 0, 1])
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

import numpy as np

from jaxloader.base.abilities import lengths_of
from jaxloader.base.checks import MASK64, Int, check_int, record_index, scalar_int
from jaxloader.base.loader_names import loader_names
from jaxloader.derived.packed_order import check_packed_order
from jaxloader.plans import packing as packing_plan
from jaxloader.plans.packed_rows import (PackedRows, check_field_names, check_fill, fill_values,
                                         fills_said, record_tokens)
from jaxloader.base.errors import ConfigError
from jaxloader.base.read_threads import tag_item
from jaxloader.sources.base import Source, check_source, records_at
from jaxloader.sources.fingerprint import combined, combined_generations, file_stamps
from jaxloader.sources.mixture import refuse_mixture
from jaxloader.sources.parts import read_locked, scan_read
from jaxloader.sources.huggingface import adapt
from jaxloader.sources.kept_arrays import kept_or_found
from jaxloader.sources.ragged import RaggedSource
from jaxloader.streams.packing_checks import warn_left_out

_LENGTH_CHUNK = 4096  # records a read of the lengths asks for at once
EMPTY_CHECKED = 256  # records lengths given call empty, read to check (none reads them after)


@loader_names("source")
class PackedSource(Source):
    """Rows of ``length`` tokens (an int, or ``{key: int}``) packed from ``source``'s 1-D
    ``keys``; ``method`` is ``"best_fit"``, ``"first_fit"`` (``bins`` rows open at a time,
    over windows of ``window`` records) or ``"concat"`` (records cut across rows: every token
    placed once); ``overlong`` says what happens to a record longer than a row: ``"split"``
    into row-sized pieces or ``"truncate"`` (listed in ``truncated``). ``value``: what the
    rows hold after their segments, a number or ``{key: number}`` (``{"ids": 0, "labels":
    -100}`` for a loss that ignores -100; the segment ids are 0 there whatever it is).
    ``seed``: the records are placed in an order shuffled by it (the same rows each epoch);
    ``None`` places them as stored, so a row packs neighbouring records (a large Parquet
    file's row groups decoded once each: docs/guides/packing.md).

    ``lengths``: the records' lengths (``(records,)`` or ``(records, keys)``), or the path of a
    ``.npy`` file that keeps them (read once from the records when it does not exist yet, or
    when the source's fingerprint changed, as ``<file>.from`` beside it says).

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> docs = jl.RaggedSource({"ids": (np.arange(1, 10), np.array([0, 3, 5, 9]))})
        >>> rows = jl.PackedSource(docs, "ids", 6)  # records of 3, 2 and 4 tokens
        >>> len(rows), rows[0]["ids"].tolist(), rows[0]["ids_segment_ids"].tolist()
        (2, [6, 7, 8, 9, 4, 5], [1, 1, 1, 1, 2, 2])
    """

    kind_known = True  # (``__getitems__([])``: its rows' keys and dtypes, one record read)

    def __init__(self, source: Source, keys: str | Iterable[str], length: Int | Mapping[str, Int],
                 *, method: packing_plan.Method = "best_fit",
                 bins: Int = 16, window: Int = 10_000,
                 overlong: packing_plan.Overlong = "split", seed: Int | None = 0,
                 lengths: np.ndarray | str | os.PathLike | None = None,
                 value: Any = 0) -> None:
        source = adapt(source)  # a datasets.Dataset: read as NumPy, lengths from Arrow
        refuse_mixture(source, "PackedSource")
        n = check_source(source)
        self.source = source
        if isinstance(keys, (set, frozenset)) and len(keys) > 1:  # (their order: the hash seed's)
            listed = sorted(keys, key=str)
            raise ConfigError(
                f"PackedSource(keys=...): got a set, {listed!r}, whose order differs from run "
                "to run (the rows' keys, the fingerprint, a lengths= array's columns would "
                f"follow it); pass a list: PackedSource(source, {listed!r}, ...)")
        self.keys = [keys] if isinstance(keys, str) else list(keys) if isinstance(
            keys, Iterable) else []
        if not self.keys or not all(isinstance(k, str) for k in self.keys):
            known = getattr(source, "keys", None)  # (a source's that says its records' keys)
            known = known if isinstance(known, list) and known and all(
                isinstance(k, str) for k in known) else ["tokens"]
            raise ConfigError(f"PackedSource(keys=...): expected a key or a list of keys of the "
                              f"records' token arrays, got {keys!r:.60}; name them, e.g. "
                              f"PackedSource(source, {known[0]!r}, length)" + (
                                  f" (the records' keys: {known})" if len(known) > 1 else ""))
        twice = next((k for i, k in enumerate(self.keys) if k in self.keys[:i]), None)
        if twice is not None:  # (it failed as a row length, a valid one, named wrong)
            raise ConfigError(f"PackedSource(keys=...): {twice!r} is named twice in "
                              f"{self.keys}; name each key once")
        check_field_names("PackedSource(keys=...)", self.keys)
        self.row_length = _row_lengths(length, self.keys)
        self._fills = fill_values("PackedSource(value=...)", value, self.keys)
        if seed is not None:  # (NumPy's ints too; not True)
            seed = check_int("PackedSource(seed=...)", seed, low=0, high=MASK64,
                             remedy="or None (records in stored order)")
        bins = check_int("PackedSource(bins=...)", bins, low=1, remedy="rows open at a time")
        window = check_int("PackedSource(window=...)", window, low=1,
                           remedy="records packed together")
        self.config = dict(method=method, bins=bins, window=window, overlong=overlong, seed=seed)
        packing_plan.check_method("PackedSource(method=...)", method)
        packing_plan.check_overlong("PackedSource(overlong=...)", overlong, method)
        self._lengths, self._kept = _lengths(source, self.keys, n, lengths)
        if self._kept is not None:
            self._check_empty()
        if method == "concat":
            self.plan = packing_plan.concat(self._lengths, int(self.row_length[0]), seed)
        else:
            self.plan = packing_plan.fit(self._lengths, self.row_length, method=method,
                                         bins=bins, window=window, overlong=overlong, seed=seed,
                                         keys=self.keys)
        if self.plan.rows == 0:
            raise ConfigError(f"PackedSource: the {n} records have no tokens under "
                              f"{self.keys}; nothing to pack")
        self._looked = False  # (keys left out looked for: in a RaggedSource's first records
        if isinstance(source, RaggedSource):  # now, cheaply; else in a first batch's)
            self._look([source[i] for i in range(min(n, 8))])
        self._flat = ([source.flat(k) for k in self.keys]
                      if isinstance(source, RaggedSource) else None)
        # each key's token dtype, the first record with tokens' (read at the first batch, not
        # here: lengths come without a record read): a batch's rows are of it, whatever
        # records it holds (NumPy would promote a batch's mixed dtypes, and a step recompile)
        self._dtypes: list[np.dtype] | None = None
        if self._flat:
            self._set_dtypes([flat[0].dtype for flat in self._flat])

    @property
    def truncated(self) -> np.ndarray:
        """The records cut to the row length (``overlong="truncate"``)."""
        return self.plan.truncated

    @property
    def padding_fraction(self) -> float:
        return self.plan.padding_fraction

    @property
    def fingerprint(self) -> str:
        """The source's fingerprint, the packing's parameters, the padding (other than
        zeros: a state saved before it counted is still taken) and the lengths."""
        fills = fills_said(self._fills)
        padding = () if fills is None else (fills,)
        return combined("packed", self.plan.rows, [self.source],
                        repr((self.keys, self.row_length.tolist(), sorted(self.config.items()),
                              *padding)), np.ascontiguousarray(self._lengths).tobytes())

    def compared_settings(self) -> dict[str, str]:
        """Its settings by name, which a run's processes compare exactly (not only a digest)."""
        unread = ("bins", "window") if self.config["method"] == "concat" else ()
        settings = {"keys": self.keys, "length": self.row_length.tolist(), **self.config,
                    "value": [float(v) for v in fills_said(self._fills) or ()]}  # (-100: -100.)
        return {name: value if isinstance(value, str) else repr(value)
                for name, value in settings.items() if name not in unread}

    def __len__(self) -> int:
        return self.plan.rows

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        index = record_index(index, len(self), "PackedSource")
        return {k: v[0] for k, v in self.__getitems__(np.array([index])).items()}

    def __getitems__(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The packed rows ``rows``, batched: one slice copy per segment and key."""
        try:
            return self._rows(rows)
        except Exception as e:  # (which of its source's records failed is not which row)
            tag_item(e, None)
            raise

    def _look(self, records: list) -> None:
        """Says once (a process) which keys of ``records`` are as long as the tokens and left
        out of the rows (labels, a loss mask: a loss over them then counts every token), as a
        ``PackedStream`` says; records not dicts are not looked at."""
        if self._looked:
            return
        self._looked = True
        for record in records:
            tokens: Any = record.get(self.keys[0]) if isinstance(record, Mapping) else None
            if hasattr(tokens, "__len__") and warn_left_out(
                    "PackedSource", "keys", record, self.keys, len(tokens)):
                return

    def _rows(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        plan = self.plan
        rows = np.asarray(rows, np.int64)
        first, last = plan.row_ptr[rows], plan.row_ptr[rows + 1]
        count = last - first
        seg = np.repeat(first - np.cumsum(count) + count, count) + np.arange(int(count.sum()))
        out_row = np.repeat(np.arange(len(rows)), count).tolist()
        rank = (seg - np.repeat(first, count) + 1).tolist()  # segment id in its row, from 1
        records = plan.record[seg]
        batch: dict[str, np.ndarray] = {}
        if isinstance(self.source, RaggedSource):  # (a mapped file cut since: refused, not
            self.source.check_mapped(soon=True)  # read to a SIGBUS; a loader's each batch)
        for k, key in enumerate(self.keys):
            if self._flat:
                values, offsets = self._flat[k]
                starts = offsets[records]
                if self._kept is not None:
                    self._check_lengths(records, k, offsets[records + 1] - starts)
            else:
                if self._dtypes is None:
                    self._set_dtypes(self._token_dtypes())
                assert self._dtypes is not None
                values, starts, lengths = _gather_records(self.source, records, key,
                                                          None if k else self._look,
                                                          self._dtypes[k])
                self._check_lengths(records, k, lengths)
            begin = (starts + plan.record_offset[seg, k]).tolist()
            at = plan.row_offset[seg, k].tolist()
            size = plan.length[seg, k].tolist()
            width = int(self.row_length[k])
            packed = PackedRows((len(rows), width), values.dtype, self._fills[k])
            packed.place_batch(values, begin, size, out_row, at, rank)
            batch.update(packed.fields(key))
        return batch

    def check_order(self, shuffle: Any) -> None:
        """The source's check of what an order reads at once (a ``ParquetSource`` warns past
        its cache), which ``DataLoader`` calls: with ``seed=``, each row packs records from all
        over the source, so the rows read from all of it at once whatever ``shuffle`` is;
        with ``seed=None`` a row's records are neighbours, and a full shuffle of the rows
        reads from all of it, a ``LocalShuffle`` of them from its blocks'
        (``derived.packed_order``)."""
        check_packed_order(self, shuffle)

    def _set_dtypes(self, dtypes: list[np.dtype]) -> None:
        for key, fill, dtype in zip(self.keys, self._fills, dtypes):
            check_fill("PackedSource(value=...)", key, fill, dtype)
        self._dtypes = dtypes

    def _token_dtypes(self) -> list[np.dtype]:
        """Each key's token dtype: its first record's with tokens (one row has some), read
        once in each process, the same in all."""
        out = []
        for k, key in enumerate(self.keys):
            with_tokens = np.flatnonzero(self._lengths[:, k])
            i = int(with_tokens[0]) if len(with_tokens) else 0  # (a key empty everywhere)
            record = read_locked(self.source, records_at, self.source, np.array([i]))[0]
            out.append(_sequence(record, key, i).dtype)
        return out

    def _check_empty(self) -> None:
        """Checks the records that lengths given (or kept in a file) call empty: no row reads
        them, so no batch's check would see one that holds tokens, lost without a word. All
        of them where the source has its own lengths (from offsets), else up to
        ``EMPTY_CHECKED`` of them, evenly spaced, read once."""
        empty = np.flatnonzero(self._lengths.sum(axis=1) == 0)
        if not empty.size:
            return
        own = [read_locked(self.source, lengths_of, self.source, k) for k in self.keys]
        if all(o is not None for o in own):
            for k, got in enumerate(own):
                self._check_lengths(empty, k, np.asarray(got)[empty])
            return
        picked = np.unique(empty[np.linspace(0, empty.size - 1, min(
            empty.size, EMPTY_CHECKED)).astype(np.int64)])
        records = read_locked(self.source, records_at, self.source, picked)
        for k, key in enumerate(self.keys):
            self._check_lengths(picked, k, np.array([len(_sequence(r, key, int(i))) for r, i
                                                     in zip(records, picked)], np.int64))

    def _check_lengths(self, records: np.ndarray, k: int, got: np.ndarray) -> None:
        """Refuses records whose ``k``-th key is not as long as the packing's lengths say
        (lengths given, or kept in a file, from data that has changed since): packed from
        them, rows would lose tokens, or take the next record's."""
        want = self._lengths[records, k]
        wrong = np.flatnonzero(got != want)
        if wrong.size:
            i = wrong[0]
            said = (f"PackedSource: record {int(records[i])}[{self.keys[k]!r}] has "
                    f"{int(got[i])} tokens, its length ")
            if self._kept is None:  # the source's own lengths, or a read, at construction
                raise ConfigError(
                    f"{said}was {int(want[i])} when the packing was planned: the source's "
                    "records are not as long as its lengths say, or not the same on each read "
                    "(a MapSource whose function changes lengths needs lengths_kept=False)")
            raise ConfigError(
                f"{said}in lengths={self._kept} is {int(want[i])}: the lengths are not this "
                "data's (it changed since they were kept?); delete a lengths file to read "
                "them again, or pass this data's lengths")

    def __repr__(self) -> str:
        return (f"PackedSource({self.plan.rows} rows of {self.row_length.tolist()} from "
                f"{len(self.source)} records, {self.config['method']}, padding "
                f"{self.plan.padding_fraction:.2%})")


def _row_lengths(length: Any, keys: list[str]) -> np.ndarray:
    wanted = {k: scalar_int(v) for k, v in (
        length.items() if isinstance(length, Mapping) else ((k, length) for k in keys))}
    if sorted(wanted) != sorted(keys) or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1
            for v in wanted.values()):
        raise ConfigError(f"PackedSource(length=...): expected a row length >= 1 (an int, or "
                          f"{{key: int}} for keys {keys}), got {length!r}")
    return np.array([wanted[k] for k in keys], np.int64)


def _lengths(source: Any, keys: list[str], n: int, given: Any) -> tuple[np.ndarray, str | None]:
    """The records' lengths, ``(records, keys)``: given, cached in a file, or read once; and
    where they came from, for messages (``None``: the source's own, or read)."""

    def find() -> np.ndarray:
        own = [read_locked(source, lengths_of, source, k)  # RaggedSource, ParquetSource, ...
               for k in keys]
        columns = [c for c in own if c is not None]
        if len(columns) == len(keys):
            return np.stack(columns, axis=1)
        return _read_lengths(source, keys, n)  # (or a Dataset's own transform, or not lists)

    found, path = kept_or_found(given, find, lambda: {
        "source": combined_generations("lengths of", n, [source], *keys,
                                       *file_stamps(source))},
        stacklevel=4)
    lengths = np.asarray(found)
    if lengths.ndim == 1:
        lengths = lengths[:, None]
    if (lengths.shape != (n, len(keys)) or lengths.dtype.kind not in "iu"
            or (lengths.size and lengths.min() < 0)):
        where = f" (from {path})" if path else ""
        raise ConfigError(
            f"PackedSource(lengths=...){where}: expected {n} non-negative integer lengths per "
            f"key {keys} (shape ({n}, {len(keys)})), got shape {lengths.shape} dtype "
            f"{lengths.dtype}"
            + (f", the least {lengths.min()}" if lengths.size and lengths.dtype.kind in "iuf"
               and lengths.min() < 0 else "")
            + ("; delete a stale cache file to read them again" if path else "; pass each "
               "record's token count (or leave lengths= out: they are read)")
        )
    kept = None if given is None else (repr(path) if path else "(an array)")
    return lengths.astype(np.int64), kept


def _read_lengths(source: Any, keys: list[str], n: int) -> np.ndarray:
    out = np.empty((n, len(keys)), np.int64)
    for start in range(0, n, _LENGTH_CHUNK):
        stop = min(n, start + _LENGTH_CHUNK)
        for i, record in enumerate(scan_read(source, records_at, np.arange(start, stop),
                                             "PackedSource")):
            for k, key in enumerate(keys):
                out[start + i, k] = len(_sequence(record, key, start + i))
    return out


def _sequence(record: Any, key: str, index: int) -> np.ndarray:
    return record_tokens(
        record, key, True,  # (an empty list: no tokens, as an empty array of any dtype)
        lambda got: ConfigError(f"PackedSource: record {index}: expected a dict with key "
                                f"{key!r} (a 1-D token array), got {got}"),
        lambda problem: ConfigError(f"PackedSource: record {index}[{key!r}]: expected a 1-D "
                                    f"array of numbers (tokens, a value a step), got {problem}"))


def _gather_records(source: Any, records: np.ndarray, key: str, look: Any,
                    dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sequences of ``records`` (each segment's record, each of ``dtype``) one after
    another, where each segment's record starts in them, and its length; ``look``: given
    the records read, where not ``None``."""
    unique, inverse = np.unique(records, return_inverse=True)
    read = records_at(source, unique)
    if look is not None:
        look(read[:8])
    seqs = [_sequence(r, key, int(i)) for r, i in zip(read, unique)]
    for i, seq in zip(unique, seqs):
        if seq.dtype != dtype and len(seq):
            raise ConfigError(
                f"PackedSource: record {int(i)}[{key!r}] holds tokens of dtype {seq.dtype}, "
                f"the first record with tokens holds {dtype}: a packed row has one dtype; give "
                f"every record's tokens one dtype (np.asarray(tokens, {str(dtype)!r}) where "
                "the source makes them, jl.MapSource say)")
    lengths = np.array([len(s) for s in seqs], np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    with_tokens = [s for s in seqs if len(s)]  # (an empty one of another dtype, or a list's
    # float64, would make the row another dtype)
    values = np.concatenate(with_tokens) if with_tokens else np.zeros(0, dtype)
    return values, starts[inverse], lengths[inverse]
