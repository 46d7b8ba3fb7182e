"""``FilteredSource``: the records of a source that a predicate keeps, found once, read by index.

::

    FilteredSource(source, keep) ──one pass (chunks of 4,096 records)──> indices of the kept
    record i ──> source[indices[i]]      (a batch: source.__getitems__(indices[rows]))

A ``DataLoader``'s batch is a fixed set of positions, a pure function of ``(seed, epoch,
step)``, so records cannot be dropped while reading (a ``Filter`` can only drop a stream's).
Filtering the source up front keeps that: the filtered source is an ordinary one, shuffled,
shared by workers and restored in O(1) like any other, and its fingerprint covers the kept
indices, so a state is not restored over another filter's records. ``indices=`` may be given
(PyTorch's ``Subset``), or be a ``.npy`` path that keeps them for the next run.

Example:
    >>> import numpy as np, jaxloader as jl
    >>> evens = jl.FilteredSource(jl.ArraySource({"x": np.arange(10)}), lambda r: r["x"] % 2 == 0)
    >>> len(evens), int(evens[3]["x"]), evens.__getitems__(np.array([0, 4]))["x"].tolist()
    (5, 6, [0, 8])
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any, Callable, Sequence

import numpy as np

from jaxloader.base.abilities import block_starts_of, lengths_of, order_check_of, origin_of
from jaxloader.base.checks import Int, check_int, check_one_argument, record_index
from jaxloader.base.errors import (ConfigError, JaxloaderError, JaxloaderWarning, RecordError,
                                   user_stacklevel)
from jaxloader.base.loader_names import loader_names
from jaxloader.base.read_threads import each
from jaxloader.sources.base import Source, check_source, records_at
from jaxloader.sources.code_digest import OLDER_FORMS, code_digest, warn_hashing
from jaxloader.sources.fingerprint import combined, combined_generations, file_stamps
from jaxloader.sources.mixture import refuse_mixture
from jaxloader.sources.parts import scan_read
from jaxloader.sources.huggingface import adapt
from jaxloader.sources.kept_arrays import check_found_from, kept_or_found
from jaxloader.batching.record_transforms import kept_answer
from jaxloader.batching.transforms import Filter, fn_name, from_grain

CHUNK = 4096  # records read at once while filtering


@loader_names("source")
class FilteredSource(Source):
    """The records of ``source`` for which ``keep(record)`` is true, in their order, found in
    one pass when it is made: in this process (through ``__getitems__`` when the source has
    it), or in ``num_workers`` worker processes, as a ``DataLoader``'s. Or ``indices``: the
    record numbers to keep (an array; any order, repeats allowed), or the path of a ``.npy``
    file that keeps the ones ``keep`` found (read back on the next run; found again when the
    source's fingerprint, a file it reads (a Parquet file, a memory-mapped array's) or
    ``keep``'s code changed, as ``<file>.from`` beside it says: its code, closure, the globals
    it names, what it names in your own modules; delete the file when something else it
    reads changed: a file it opens, say). ``keep`` may also be a ``jl.Filter`` or a Grain
    ``Filter`` object (its ``filter`` method), as a ``StreamLoader``'s ``transforms=`` takes
    them.

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> texts = jl.ArraySource({"n": np.array([3, 0, 7, 1])})
        >>> kept = jl.FilteredSource(texts, lambda r: r["n"] > 0)
        >>> kept.indices.tolist(), len(kept)
        ([0, 2, 3], 3)
    """

    def __init__(self, source: Source, keep: Callable[[Any], Any] | Filter | None = None, *,
                 indices: np.ndarray | Sequence[int] | str | os.PathLike | None = None,
                 num_workers: Int = 0) -> None:
        num_workers = check_int("FilteredSource(num_workers=...)", num_workers, low=0,
                                remedy="the workers that run keep over the source; 0: none")
        source = adapt(source)  # a datasets.Dataset: read (and kept) as NumPy
        refuse_mixture(source, "FilteredSource")
        n = check_source(source)
        grain = from_grain(keep)  # a Grain Filter, as the loaders' transforms= take it
        if isinstance(keep, Filter):
            keep = keep.fn
        elif isinstance(grain, Filter):
            keep = grain.fn
        if keep is not None and not callable(keep):
            raise ConfigError(f"FilteredSource(keep): expected a function of a record "
                              f"returning True to keep it, got {type(keep).__name__}")
        if keep is not None:  # (called with a record alone: one of two arguments failed at
            check_one_argument("FilteredSource(keep)", keep, "keep(record)")  # the first)
            warn_hashing(keep, "FilteredSource(keep)")
        if keep is not None and indices is not None and not isinstance(indices, (str,
                                                                                 os.PathLike)):
            raise ConfigError(  # (keep would never be called: the indices are the records)
                f"FilteredSource: got both keep {fn_name(keep)} and indices= record numbers, "
                "of which only the indices would be used; pass one of them, or indices= the "
                "path of a .npy file that keeps the records keep finds for the next run")
        if keep is None and num_workers:  # (given, to no effect)
            warnings.warn(f"FilteredSource(num_workers={num_workers}) without keep: no "
                          "function runs over the source (the indices are the records); "
                          "leave num_workers out", JaxloaderWarning,
                          stacklevel=user_stacklevel())

        def find() -> np.ndarray:
            if keep is None:
                missing = f", and {indices} does not exist yet" if indices is not None else ""
                raise ConfigError("FilteredSource: expected keep (a function of a record) or "
                                  f"indices (the record numbers to keep){missing}")
            return (_kept_by_workers(source, keep, num_workers) if num_workers
                    else _kept(source, keep, n))

        def source_digest() -> tuple[str, ...]:
            return combined_generations("source", n, [source], *file_stamps(source))

        if keep is None:  # (a file of another source's records, read here as they are)
            check_found_from(indices, lambda: {"source": source_digest()}, "FilteredSource",
                             "pass keep= (the function that kept them) to find them for this "
                             "source, or the file found from it")
        found, path = kept_or_found(indices, find, None if keep is None else lambda: {
            "source": source_digest(),
            "keep function": (code_digest(keep, deep=True), *(  # (or as older versions:
                code_digest(keep, deep=True, whole_owner=True, **form)  # until 12-04, 12-02's
                for form in ({}, *({**f, "methods": False} for f in OLDER_FORMS[:2]))))})
            # 45th session, 12-01's 40th)
        self.source, self.indices = source, _checked(found, n, path)
        if not len(self.indices):
            what = f"keep {fn_name(keep)} kept" if keep is not None else "indices name"
            raise ConfigError(f"FilteredSource: {what} none of the {n} records; nothing to "
                              "read")

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Any:
        index = record_index(index, len(self.indices), "FilteredSource")
        return self.source[int(self.indices[index])]

    def record_origin(self, index: int) -> str | None:
        """Where its record ``index`` (the source's kept one) comes from, for messages: the
        source's own answer, else its record's number there (a pool's row, the one the user
        knows)."""
        i = int(self.indices[index])
        return origin_of(self.source, i) or f"its source's record {i}"

    def __getitems__(self, rows: np.ndarray) -> Any:
        picked = self.indices[np.asarray(rows, np.int64)]
        if hasattr(self.source, "__getitems__"):
            return self.source.__getitems__(picked)
        return each(self.source.__getitem__, picked.tolist())

    @functools.cached_property
    def block_starts(self) -> np.ndarray | None:
        """The source's blocks (a ``ParquetSource``'s row groups) among the kept records, for
        ``LocalShuffle``, when the kept records are in the source's order."""
        starts = block_starts_of(self.source)
        if starts is None or not np.all(self.indices[1:] > self.indices[:-1]):
            return None
        return np.unique(np.searchsorted(self.indices, starts))

    def lengths(self, key: str) -> np.ndarray | None:
        """The kept records' lengths of ``key`` from the source's own (``PackedSource``'s
        lengths with no record read); ``None`` when the source has none."""
        got = lengths_of(self.source, key)
        return None if got is None else got[self.indices]

    def check_order(self, shuffle: Any) -> None:
        """The source's own check of an order (a ``ParquetSource`` warns when the order reads
        from more row groups at once than its cache holds), which ``DataLoader`` calls: a
        full shuffle of the kept records reads from all the source's row groups too, and a
        ``LocalShuffle`` of the source's blocks as many at a time."""
        from jaxloader.order.local_shuffle import LocalShuffle

        check = order_check_of(self.source)
        if check is None or isinstance(shuffle, LocalShuffle) and (
                shuffle.block_size is not None or self.block_starts is None):
            return  # (blocks of kept records: what they read of the source is not known)
        check(shuffle)

    @property
    def fingerprint(self) -> str:
        """The source's fingerprint and the kept indices."""
        return combined("filtered", len(self.indices), [self.source],
                        np.ascontiguousarray(self.indices).tobytes())

    def __repr__(self) -> str:
        return (f"FilteredSource({len(self.indices)} of {len(self.source)} records of "
                f"{type(self.source).__name__})")


def _kept(source: Any, keep: Callable[[Any], Any], n: int) -> np.ndarray:
    out = []
    for start in range(0, n, CHUNK):
        chunk = np.arange(start, min(n, start + CHUNK))
        records = scan_read(source, records_at, chunk, "FilteredSource")  # (a loader over it
        # in another thread reads between chunks; ``keep`` runs holding none)
        i = start  # (the record ``keep`` raised on, named in the error)
        try:  # (around the chunk, not each record: the scan reads every record)
            for i, record in enumerate(records, start):
                if kept_answer(keep(record), lambda: f"FilteredSource(keep) {fn_name(keep)}, "
                               f"on record {i},"):
                    out.append(i)
        except JaxloaderError:
            raise
        except Exception as e:
            raise RecordError(f"FilteredSource(keep) {fn_name(keep)} raised "
                              f"{type(e).__name__} on record {i}: {e}") from e
    return np.array(out, np.int64)


def _kept_by_workers(source: Any, keep: Callable[[Any], Any], num_workers: int) -> np.ndarray:
    """``_kept`` over a ``DataLoader``'s workers: each batch of ``CHUNK`` records in order,
    a flag a record."""
    from jaxloader.loaders.data_loader import DataLoader
    from jaxloader.batching.transforms import Map

    kept, start = [], 0
    with DataLoader(source, batch_size=CHUNK, transforms=[Map(_Flag(keep))],
                    num_workers=num_workers, last_batch="partial", process_index=0,
                    process_count=1) as loader:
        for flags in loader:  # (a view of a worker's slot: not kept, so the slot goes back)
            if (flags > 1).any():  # (None or a string: refused naming its record, here)
                bad = int(np.flatnonzero(flags > 1)[0])
                kept_answer(None if flags[bad] == 2 else "", lambda: f"FilteredSource(keep) "
                            f"{fn_name(keep)}, on record {start + bad},",
                            "" if flags[bad] == 2 else "a string")
            kept.append(np.flatnonzero(flags == 1) + start)
            start += len(flags)
    return np.concatenate(kept).astype(np.int64)


class _Flag:
    """``keep``'s answer for a record as a worker batches it: 1 keep, 0 drop, 2 ``None`` and 3
    a string (refused where the record's number is known: ``_kept_by_workers``)."""

    def __init__(self, keep: Callable[[Any], Any]) -> None:
        self.keep = keep

    def __call__(self, record: Any) -> np.int8:
        kept = self.keep(record)
        return np.int8(2 if kept is None else 3 if isinstance(kept, (str, bytes)) else
                       bool(kept))

    def __repr__(self) -> str:
        return f"FilteredSource(keep) {fn_name(self.keep)}"


def _checked(indices: Any, n: int, path: str | None) -> np.ndarray:
    array = np.asarray(indices)
    where = f" (from {path})" if path else ""
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        mask = array.dtype == bool and not path
        found = isinstance(indices, tuple) and len(indices) == 1  # (np.where's, np.nonzero's)
        raise ConfigError(f"FilteredSource(indices){where}: expected a 1-D array of record "
                          f"numbers, got shape {array.shape} dtype {array.dtype}"
                          + ("; for a mask, pass np.flatnonzero(mask)" if mask else "")
                          + ("; np.where(...) gives a tuple of one array for each axis: pass "
                             "np.where(...)[0]" if found else "")
                          + (f"; a {type(indices).__name__} is not an array: pass "
                             + ("np.fromiter(sorted(indices), np.int64) (a set has no order "
                                "of its own)" if isinstance(indices, (set, frozenset)) else
                                "np.fromiter(indices, np.int64)")
                             if array.dtype == object and array.ndim == 0 else ""))
    array = array.astype(np.int64)
    if array.size and (array.min() < 0 or array.max() >= n):
        at = int(np.flatnonzero((array < 0) | (array >= n))[0])
        remedy = ("delete a stale file to filter again" if path else
                  "indices count from 0, with no negative ones (np.arange(n)[indices] turns "
                  "them into record numbers)" if array[at] < 0 else
                  f"the source has {n} records: indices of another, larger one?")
        raise ConfigError(
            f"FilteredSource(indices){where}: expected record numbers in [0, {n}), got "
            f"numbers from {array.min()} to {array.max()} (indices[{at}] is {int(array[at])}); "
            f"{remedy}")
    array.flags.writeable = False
    return array

