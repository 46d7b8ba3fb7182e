"""``MapSource``: a source whose records pass through a function of its own, before it is mixed,
concatenated or packed.

::

    MapSource(source, fn)                 record i = fn(source[i])     (in the workers)
    MapSource(source, fn, batched=True)   rows = fn(source.__getitems__(indices)): a function
                                          of a batch of columns, as a BatchMap is
    what the source can do, kept: its blocks (LocalShuffle reads locally), list lengths
    (PackedSource needs no pass), its files (named in a state), close(); its fingerprint
    joined with the function's code, so a state of another function is refused

Components from different datasets need renaming, casting and parsing before they meet in one
``jl.mix``: a Parquet column of ``float64`` mixed with arrays of ``float32`` is refused until one
is cast. Grain maps a dataset before mixing it (``ds.map(f)``), Hugging Face maps each of
``interleave_datasets``' datasets; this is the same for a jaxloader source. ``Stream.map``
(``jaxloader.streams.reader``) does it for a stream.

Example:
    >>> import numpy as np
    >>> from jaxloader.sources import ArraySource
    >>> wide = ArraySource({"x": np.arange(4, dtype=np.float64)})
    >>> cast = MapSource(wide, lambda r: {"x": np.float32(r["x"])})
    >>> cast[2]["x"].dtype, len(cast)
    (dtype('float32'), 4)
    >>> columns = MapSource(wide, lambda b: {"x": b["x"].astype(np.float32)}, batched=True)
    >>> columns.__getitems__(np.array([3, 1]))["x"].tolist()
    [3.0, 1.0]
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from typing import Any, Callable, cast

import numpy as np

from jaxloader.base import read_threads
from jaxloader.base.abilities import (ARRAYS_LEFT_OUT, OLDER, OWNER_LEFT_OUT, RECORDS_AS_BEFORE,
                                      block_starts_of, digest_level, lengths_of,
                                      order_check_of, origin_of)
from jaxloader.base.checks import (callable_name, check_bool, check_one_argument, record_index,
                                   source_said)
from jaxloader.base.errors import ConfigError
from jaxloader.base.loader_names import loader_names
from jaxloader.base.own_records import top_copy
from jaxloader.base.random_state import draws, global_examples, warn_at
from jaxloader.sources.array_digest import arrays_digest
from jaxloader.sources.base import check_source, records_at
from jaxloader.sources.protocol import BatchedSource, Source
from jaxloader.sources.code_digest import code_digest, code_digests, warn_hashing
from jaxloader.sources.fingerprint import combined, mapped_records
from jaxloader.sources.huggingface import adapt


WATCHED = 16  # reads a MapSource's function is watched on for draws, in each process
SEEN = 2  # reads it drew on before it is said
_WATCHES: dict[int, tuple[weakref.ref, list[int]]] = {}  # id -> (the source, its counts)


def _forget(at: int, _: object) -> None:
    _WATCHES.pop(at, None)

@loader_names("source")
class MapSource(Source):
    """``source``'s records through ``fn`` (a record's function; with ``batched``, a function
    of a batch of columns, as ``source.__getitems__`` gives them, whose rows are each a function
    of their own row: a record read alone, as ``peek()`` reads it, is a batch of one).
    ``lengths_kept``: whether ``fn`` keeps the lengths of the list columns it does not drop, so
    that ``PackedSource`` reads them from ``source`` without a pass (the default); say
    ``False`` for a function that tokenizes or cuts them (``PackedSource`` then reads the
    mapped records once).

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> tens = jl.MapSource(jl.ArraySource({"x": np.arange(4)}), lambda r: {"x": r["x"] * 10})
        >>> len(tens), int(tens[2]["x"])
        (4, 20)
    """

    batched: bool  # (fn takes a batch of columns)

    def __init__(self, source: Source, fn: Callable[[Any], Any], *, batched: bool = False,
                 lengths_kept: bool = True) -> None:
        from jaxloader.sources.mixture import refuse_mixture

        if callable(source) and (inspect.isclass(source) or not (hasattr(
                source, "__len__") and hasattr(source, "__getitem__"))) and not callable(
                    fn) and hasattr(fn, "__getitem__"):  # (a function, a partial, a class;
            named = getattr(source, "__name__", type(source).__name__)  # not a source)
            raise ConfigError(
                f"MapSource(source, fn): got a callable ({named:.60}) as the source and "
                f"{type(fn).__name__} {fn!r:.60} as fn; the source comes first: "
                "MapSource(source, fn)")
        source = adapt(source)  # a datasets.Dataset: read as NumPy, as the loader reads it
        refuse_mixture(source, "MapSource")
        check_source(source)
        if not callable(fn):
            method = getattr(fn, "map", None)  # (a Grain Map object: its bound method)
            hint = (f"; pass its method: MapSource(source, {type(fn).__name__}(...).map)"
                    if callable(method) else "")
            raise ConfigError(f"MapSource(fn): expected a function of a record (or, with "
                              f"batched=True, of a batch of columns), got "
                              f"{type(fn).__name__}{hint}")
        batched = check_bool("MapSource(batched)", batched)  # (before its truth is used)
        check_one_argument("MapSource(fn)", fn, "fn(batch)" if batched else "fn(record)")
        warn_hashing(fn, "MapSource(fn)")
        if batched and isinstance(source, MapSource) and not source.batched:
            raise ConfigError(
                "MapSource(batched=True): the source is a MapSource of records (batched=False), "
                "which reads a list of records, not a batch of columns; map them one by one "
                "(batched=False), or make the inner one batched=True")
        if batched and not isinstance(source, BatchedSource):
            raise ConfigError(
                f"MapSource(batched=True): the source ({type(source).__name__}) reads no batch "
                "of columns (it has no __getitems__); map its records one by one "
                "(batched=False)")
        self.source, self.fn = source, fn
        self.batched = batched
        # (its digest as made: a memo the function fills as it reads, a closure's or a
        # default's, must not make the state of a run that read records another source's);
        # and as versions until 2026-11-30 took it (no defaults: what their states hold)
        self._fn_digests = code_digests(fn)
        # (and the bytes of the arrays it holds, which its code's digest reads by their repr:
        # a lookup table changed deep inside restored without a word; "" where it holds none)
        self._arrays = arrays_digest(fn)
        # (a bound method's object as its code reads it, self.k: a MapSource(source, Scale(2)
        # .apply) restored over Scale(3)'s without a word; "" for any other function)
        self._owner = code_digest(fn, bound=True) if inspect.ismethod(fn) else ""
        self._mapped: str | None = None  # (the mapped records' hash: made when first asked)
        self.lengths_kept = check_bool("MapSource(lengths_kept)", lengths_kept)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Any:
        if self.batched:  # (a float refused, not cut; -1 the last record)
            index = record_index(index, len(self), "MapSource")
            columns = self._columns(np.array([index], np.int64))
            return _first_row(self._watched(lambda: self._named(self.fn, columns)))
        record = top_copy(self.source[index])  # (its source's own: fn may set a key)
        return self._watched(lambda: self._named(self.fn, record))

    def __getitems__(self, indices: np.ndarray) -> Any:
        """The records at ``indices``: a batch of columns through ``fn`` (``batched``), else
        a list of records, each through ``fn`` (the source read at once where it can; on a
        loader's read threads, each record read and mapped on them: ``fn`` is a read)."""
        if self.batched:
            columns = self._columns(indices)
            return self._watched(lambda: self._named(self.fn, columns))
        if read_threads.count() > 1 and not hasattr(self.source, "__getitems__"):
            return read_threads.each(self.__getitem__, np.asarray(indices).tolist())
        records = records_at(self.source, indices)
        return self._watched(lambda: self._each(records))

    def _watched(self, call: Callable[[], Any]) -> Any:
        """``call()``, ``fn`` over a read, watched on the first ``WATCHED`` reads in each
        process's main thread for draws from NumPy's or Python's global random state: not the
        loader's numbers (the batches then differ with the worker count and after a restore),
        and unseen by a state, whose fingerprint of a MapSource is its function's code."""
        if threading.current_thread() is not threading.main_thread():
            return call()
        entry = _WATCHES.get(id(self))  # (reads left, reads that drew: this process's, out
        if entry is None or entry[0]() is not self:  # of the source's attributes, which
            ref = weakref.ref(self, functools.partial(_forget, id(self)))  # digests
            entry = _WATCHES[id(self)] = (ref, [WATCHED, 0])  # of what holds it read; by id:
        watch = entry[1]  # a subclass may define __eq__, and so no hash)
        if watch[0] <= 0:
            return call()
        watch[0] -= 1
        before = draws()
        out = call()
        if before is not None and draws() != before:
            watch[1] += 1
            if watch[1] == SEEN:  # (one: a module imported at the first call may draw)
                watch[0] = 0
                warn_at(self.fn, (
                    f"{self!r}: its function drew from the global random state "
                    f"({global_examples()}) on {SEEN} of its first reads: unless it seeds it "
                    "from the record itself first (then leave this be), those numbers are not "
                    "the loader's, so the batches differ with the worker count, from run to run "
                    "and after a restore, and a state does not tell (it names the function by "
                    "its code); draw in a RandomMap after the source (jl.RandomMap(lambda "
                    "record, rng: ... rng.random() ...))"), "<MapSource>")
        return out

    def _each(self, records: list) -> list:
        """``records``, each through ``fn``."""
        for j, record in enumerate(records):
            try:
                records[j] = self._named(self.fn, top_copy(record))
            except Exception as e:  # (the batch maker's message names the record)
                read_threads.tag_item(e, j)
                raise
        return records

    def _named(self, fn: Callable[[Any], Any], arg: Any) -> Any:
        """``fn(arg)``; an error it raises noted with the function's name (the batch maker's
        message said 'source.__getitems__ raised ValueError', where a Map's names it)."""
        try:
            return fn(arg)
        except Exception as e:
            if not any("MapSource(" in n for n in getattr(e, "__notes__", ())):  # (inner)
                e.add_note(f"in MapSource({callable_name(fn)})'s function")
            raise

    def _columns(self, indices: np.ndarray) -> Any:
        """The source's batch of columns at ``indices``; refused where it reads records."""
        got = cast(BatchedSource, self.source).__getitems__(indices)
        if isinstance(got, list):  # (a ragged list column, a list among its parts)
            raise ConfigError(
                f"MapSource(batched=True): the source ({type(self.source).__name__}) reads "
                "a list where a batch of columns was expected: records (a column of lists of "
                "other lengths, a list or record-wise MapSource among its parts: map them one "
                "by one, batched=False), or an ArraySource's columns as a list (give it a dict "
                "or a tuple of arrays)")
        return got

    @property
    def block_starts(self) -> np.ndarray | None:
        """The source's blocks (row groups), as a map keeps the records where they are."""
        return block_starts_of(self.source)

    def lengths(self, key: str) -> np.ndarray | None:
        """The source's lengths of list column ``key`` where the map keeps them
        (``lengths_kept``); ``None`` where it does not or the source has none (a
        ``PackedSource`` then reads the mapped records once)."""
        if not self.lengths_kept:
            return None
        try:
            return lengths_of(self.source, key)
        except ConfigError as e:  # (a function that makes the key: its source has none)
            raise ConfigError(
                f"{self!r}.lengths({key!r}): lengths_kept=True takes the source's lengths, "
                f"and it has none: {e}. Where the function makes or changes {key!r} (a "
                "tokenizer), pass lengths_kept=False: the mapped records' lengths are then "
                "read once") from None

    def record_origin(self, index: int) -> str | None:
        """Where the source's record ``index`` comes from (a file), for messages."""
        return origin_of(self.source, index)

    def check_order(self, shuffle: Any) -> None:
        """The source's check of what an order reads at once (a Parquet file's cache)."""
        check = order_check_of(self.source)
        if check is not None:
            check(shuffle)

    @property
    def fingerprint(self) -> str:
        """The source's fingerprint, the function's code and the arrays it holds, and a hash
        of its records 0, n // 2 and n - 1 as mapped: what the function reads beyond its code
        and closure (a module's vocabulary, a set's order) changes them (each left out as
        older versions wrote it: at an older ``digest_level()``)."""
        level = digest_level()
        now = not level and not ARRAYS_LEFT_OUT.get()  # (as versions until 2026-12-05 wrote
        held = tuple(h for h in (self._arrays, "" if OWNER_LEFT_OUT.get() else self._owner)
                     if h) if now else ()  # it: neither; until 2026-12-07: the arrays alone;
        if now and not (OWNER_LEFT_OUT.get() or RECORDS_AS_BEFORE.get() or OLDER.get()):
            if self._mapped is None:  # until its eleventh session: no mapped records)
                self._mapped = mapped_records(self)
            held += (self._mapped,) if self._mapped else ()
        return combined("map", len(self), [self.source], self._fn_digests[level],
                        b"batched" if self.batched else b"records", *held)

    @property
    def older_fingerprints(self) -> tuple[None] | None:  # (base.abilities.OLDER)
        """``(None,)`` where older versions wrote the fingerprint otherwise (its defaults
        left out, sets in their run's order, the arrays it holds left out, its mapped records
        unhashed: every one it reads here): theirs is ``fingerprint`` at ``digest_level()``."""
        return (None,) if len(set(self._fn_digests)) > 1 or self._arrays or self._owner or \
            self._mapped != "" else None

    def __repr__(self) -> str:
        name = callable_name(self.fn)
        return f"MapSource({source_said(self.source)}, {name}{', batched' if self.batched else ''})"


def _first_row(columns: Any) -> Any:
    """The record of a batch of one row: each column's first row, through dicts and tuples
    (a list column, of strings say, is a column: its first item).

    Example:
        >>> _first_row({"a": np.array([3]), "b": (np.array([[1, 2]]), ["word"])})
        {'a': np.int64(3), 'b': (array([1, 2]), 'word')}
    """
    if isinstance(columns, dict):
        return {key: _first_row(value) for key, value in columns.items()}
    if isinstance(columns, tuple):
        rows = [_first_row(value) for value in columns]
        return type(columns)(*rows) if hasattr(columns, "_fields") else tuple(rows)
    return columns[0]
