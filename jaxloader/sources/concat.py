"""``ConcatSource``: several sources one after another, as one index space.

Index ``i`` is record ``i - offsets[k]`` of source ``k``, where ``offsets`` are the cumulative
lengths: a pure function of the index, so shuffling, resuming and worker counts work across the
parts as over one source.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator, Mapping, ValuesView
from typing import Any, NamedTuple, Sequence, cast

import numpy as np

from jaxloader.base import tree as tree_lib
from jaxloader.base.abilities import OLDER, OLDER_DIGESTS, block_starts_of, lengths_of, origin_of
from jaxloader.base.batch_rows import split_rows
from jaxloader.base.checks import check_indices, int_indices, record_index
from jaxloader.base.columns import memmap_under, overlapping
from jaxloader.base.errors import CollateError, ConfigError
from jaxloader.base.loader_names import loader_names
from jaxloader.base.read_threads import each, item_of, tag_item
from jaxloader.sources.arrays import ArraySource
from jaxloader.sources.base import Source, check_source, large_views, one_each
from jaxloader.sources.concat_merge import merged
from jaxloader.sources.huggingface import adapt


@loader_names("source")
class ConcatSource(Source):
    """``sources[0]``'s records, then ``sources[1]``'s, and so on. ``names``: one a source,
    which messages name a part by (its place where left out). Parts are read together in a
    batch: a ``DataLoader`` of batches of more than one record refuses ``ArraySource`` parts
    whose records differ (keys, dtypes, shapes) as it is made, with the remedy.

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> both = jl.ConcatSource([jl.ArraySource({"x": np.arange(3)}),
        ...                         jl.ArraySource({"x": np.arange(10, 12)})])
        >>> len(both), int(both[3]["x"]), both.locate(np.array([0, 4])).tolist()
        (5, 10, [[0, 0], [1, 1]])
    """

    # False for a source whose records by index are not what a loader reads of it (a Mixture:
    # its weights apply through the loader's sampler): refused as a part
    read_by_index = True
    _PLACE = "sources"  # (a part by its place, in messages)

    def __init__(self, sources: Sequence[Source], names: Sequence[str] | None = None) -> None:
        given = sources
        if isinstance(sources, (list, tuple, collections.deque, ValuesView, Iterator)):
            sources = list(sources)  # (a generator, a dict's values: their list, in order)
        else:  # (one source, a string: its records were taken for the parts; a set: in no
            sources = []  # order; a stream: endless)
        if not sources:
            raise ConfigError(
                f"ConcatSource(sources): expected a non-empty list of sources, got "
                f"{type(given).__name__} {given!r:.80}; pass [source_a, source_b, ...]")
        sources = [adapt(s) for s in sources]  # datasets.Dataset parts as NumPy
        for k, source in enumerate(sources):
            if not getattr(source, "read_by_index", True):
                raise ConfigError(
                    f"ConcatSource: sources[{k}] is a mixture (jl.mix), which it would read as "
                    "its components one after another, the weights unused; mix the other "
                    "sources in with it instead: jl.mix([a, b, other], weights)")
        lengths = []
        for k, source in enumerate(sources):
            try:
                lengths.append(check_source(source))
            except ConfigError as e:
                raise ConfigError(f"ConcatSource: sources[{k}]: {e}") from None
        self.sources = list(sources)
        self.names = None if names is None else _names(names, len(sources), type(self).__name__)
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.alike_arrays = _alike_arrays(self.sources)
        # In a worker, alike in-memory parts arrive as one array a leaf (see __getstate__):
        # a batch is then one gather a leaf, as for one source. None in the main process.
        self.joined: Any = None

    def __getstate__(self) -> dict:
        """Alike parts of plain in-memory arrays cross to workers joined, one array a leaf:
        the worker payload copies each part into its rows of one shared-memory segment (no
        more memory than the parts copied apart), so a worker gathers a batch with one
        ``take`` a leaf. Memory-mapped parts cross as their files and windows as the bytes they
        span, never joined (``_joinable``)."""
        state = dict(self.__dict__)
        if self.joined is None and _joinable(self.sources):
            parts = cast("list[ArraySource]", self.sources)  # (joinable: ArraySources all)
            arrays = [s.arrays for s in parts]
            state["sources"] = _JoinedParts(parts[0].treedef,
                                            [JoinedArrays([a[i] for a in arrays])
                                             for i in range(len(arrays[0]))])
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if isinstance(self.sources, _JoinedParts):
            from jaxloader.sources.arrays import ArraySource

            treedef, leaves = self.sources
            self.joined = ArraySource(tree_lib.unflatten(treedef, leaves))
            self.sources = [ArraySource(tree_lib.unflatten(treedef, [a[lo:hi] for a in leaves]))
                            for lo, hi in zip(self.offsets[:-1], self.offsets[1:])]

    @property
    def block_starts(self) -> np.ndarray | None:
        """``LocalShuffle``'s blocks when a part has its own (a ``ParquetSource``'s row
        groups): each part's blocks (1,024 records in a part without), where they start in
        the whole, and its length last. ``None`` when no part has its own."""
        from jaxloader.order.local_shuffle import LocalShuffle

        if all(block_starts_of(s) is None for s in self.sources):
            return None
        cut = LocalShuffle()
        starts = [cut.block_starts(s, n)[:-1] + offset for s, n, offset
                  in zip(self.sources, np.diff(self.offsets).tolist(), self.offsets[:-1])]
        return np.concatenate([*starts, self.offsets[-1:]]).astype(np.int64)

    def lengths(self, key: str) -> np.ndarray | None:
        """Each part's ``lengths(key)`` one after another: what ``PackedSource`` needs, with
        no record read; ``None`` when a part has none (``PackedSource`` then reads them)."""
        parts = []
        for source in self.sources:
            got = lengths_of(source, key)
            if got is None:
                return None
            parts.append(got)
        return np.concatenate(parts)

    def split(self, indices: np.ndarray) -> tuple[list[int], list, list]:
        """The parts ``indices`` fall in, ascending; for each, the places in ``indices`` that
        fall in it and its own indices there. A cost of the batch, not of the parts.

        Example:
            >>> import numpy as np, jaxloader as jl
            >>> both = jl.ConcatSource([jl.ArraySource(np.arange(3)), jl.ArraySource(np.arange(2)),
            ...                         jl.ArraySource(np.arange(4))])
            >>> read, rows, local = both.split(np.array([6, 0, 7]))
            >>> read, [r.tolist() for r in rows], [i.tolist() for i in local]
            ([0, 2], [[1], [0, 2]], [[0], [1, 2]])
        """
        parts = np.searchsorted(self.offsets, indices, side="right") - 1
        order = np.argsort(parts, kind="stable")
        cuts = np.flatnonzero(np.diff(parts[order])) + 1
        rows = np.split(order, cuts)
        read = parts[order[np.concatenate([[0], cuts])]].tolist() if len(order) else [0]
        return read, rows, [indices[r] - self.offsets[k] for k, r in zip(read, rows)]

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, indices: np.ndarray) -> np.ndarray:
        """``[source number, index in it]`` for each index (a ``(n, 2)`` array)."""
        parts = np.searchsorted(self.offsets, indices, side="right") - 1
        return np.stack([parts, indices - self.offsets[parts]], axis=-1)

    def record_origin(self, index: int) -> str | None:
        """Where record ``index`` comes from (its part's file, else the part), for
        messages."""
        part = int(np.searchsorted(self.offsets, index, side="right")) - 1
        local = index - int(self.offsets[part])
        found = origin_of(self.sources[part], local)
        if found and not found.startswith(("its source's record ", "sources[")):
            return found  # (a file's row names it; a subset's or a nested part's answer says
        # which part of this one it is in too)
        return f"{found} in {self.label(part)}" if found else f"{self.label(part)} record {local}"

    def __getitem__(self, index: int) -> Any:
        index = record_index(index, len(self), type(self).__name__)
        part = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return self.sources[part][int(index - self.offsets[part])]

    def __getitems__(self, indices: np.ndarray) -> Any:
        """The records at ``indices``, each part read with its own ``__getitems__`` (when it
        has one): a batched pytree when every part gives one, else a list of records."""
        indices = int_indices(indices, len(self), "ConcatSource")
        located = self.locate(indices)
        parts, local = located[:, 0], located[:, 1]
        low, high = (int(parts.min()), int(parts.max())) if len(parts) else (0, 0)
        if low < 0 or high >= len(self.sources):  # (an index out of range is in no part)
            check_indices(indices, len(self), "ConcatSource")
        if low == high:  # one part: read in the order asked
            runs = [np.arange(len(parts))]
        else:  # each part's rows ascending (a file source then has no order to put back)
            order = np.argsort(indices, kind="stable")
            runs = np.split(order, np.flatnonzero(np.diff(parts[order])) + 1)
        pieces, of = [], []
        for run in runs:
            part = int(parts[run[0]]) if len(run) else 0
            of.append(part)
            source = self.sources[part]
            try:
                if hasattr(source, "__getitems__"):
                    got = source.__getitems__(local[run])
                    if isinstance(got, list):
                        one_each(got, len(run), f"ConcatSource's sources[{part}]")
                    pieces.append((run, got))
                else:
                    pieces.append((run, each(source.__getitem__, local[run].tolist())))
            except Exception as e:  # (a part's record named: where it is among indices)
                at = item_of(e)
                if at is not None and 0 <= at < len(run):
                    tag_item(e, int(run[at]))
                raise
        if any(isinstance(got, list) for _, got in pieces):
            records: list = [None] * len(parts)
            for run, got in pieces:
                rows = got if isinstance(got, list) else split_rows(got, len(run))
                for j, record in zip(run, rows):
                    records[j] = record
            return records
        return merged(pieces, len(parts), lambda i: self.label(of[i]))

    def check_alike(self, parts: list[int], shapes: bool = True) -> None:
        """Refuses ``parts`` (read together in batches), ``ArraySource`` and ``PackedSource``
        parts (``kind_known``) whose rows would not merge into one batch (other keys, dtypes,
        row shapes), as a batch of them would: known now (a mixture's component of small
        weight was first read at step 12, and refused there; packed rows of int32 and int64
        tokens in a worker at the first batch). ``shapes=False``: parts read in batches of their own
        (a schedule's phases), which may differ in row shapes, not in ranks (a loader's
        batches are of one kind: ``base.batch_kinds``)."""
        arrays = [p for p in parts if getattr(type(self.sources[p]), "kind_known", False)]
        if len(arrays) > 1 and not large_views(self):  # (records read one by one, as views:
            # a record Map may make them alike, a crop of volumes of two sizes)
            rows = [cast(ArraySource, self.sources[p]).__getitems__(np.arange(0))
                    for p in arrays]  # (or a PackedSource: kind_known)
            if not shapes:  # (each leaf of the first's rank given the first's row shape)
                first, treedef = tree_lib.flatten(rows[0])
                for i, one in enumerate(rows):
                    leaves, other = tree_lib.flatten(one)
                    if other == treedef:
                        rows[i] = tree_lib.unflatten(treedef, [
                            np.empty(f.shape, a.dtype) if a.ndim == f.ndim else a
                            for a, f in zip(leaves, first)])
            try:
                merged([(np.arange(0), r) for r in rows], 0, lambda i: self.label(arrays[i]))
            except CollateError as e:
                raise ConfigError(str(e) if shapes else str(e).replace(
                    " (a Map on the loader cannot: parts are read together)",
                    ", or pass the loader a Map that makes every record of one kind. Its "
                    "schedule (jl.mix(from_step=)) reads them at other steps, and a loader's "
                    "batches are all of one kind (keys, dtypes and ranks: what a jitted step "
                    "was compiled for; row sizes may change): the run would stop at the step "
                    "that moves to the other")) from None

    def label(self, part: int) -> str:
        """Part ``part`` as messages name it: by its name in ``jl.mix``, else its place."""
        return f"{self.names[part]!r}" if self.names else f"{self._PLACE}[{part}]"

    def __repr__(self) -> str:
        return f"ConcatSource({len(self)} records in {len(self.sources)} sources)"

    @property
    def fingerprint(self) -> str | None:
        """Its parts' fingerprints (each part's own, or three of its records), in order: a part
        that changed is seen wherever it is. ``None`` as versions until 2026-12-03 wrote it
        (``OLDER_DIGESTS``, ``OLDER``): three records of the whole, which a large last part
        held (an edited function, other arrays in a part between: restored without a word)."""
        if OLDER_DIGESTS.get() or OLDER.get():
            return None
        from jaxloader.sources.fingerprint import combined

        self.part_digests: list[str] = []  # (each part's, as this fingerprint made them)
        return combined("concat", len(self), self.sources, parts=self.part_digests)

    older_fingerprints = (None,)  # (its states were written otherwise: ``fingerprint``)


def _alike_arrays(sources: list) -> bool:
    """Whether every part is an ``ArraySource`` with the same structure, dtypes and record
    shapes (then a batch is gathered from the parts' arrays straight into its slot)."""
    if not all(type(s) is ArraySource for s in sources):
        return False
    first = sources[0]
    signature = [(a.dtype, a.shape[1:]) for a in first.arrays]
    return all(s.treedef == first.treedef and [(a.dtype, a.shape[1:]) for a in s.arrays]
               == signature for s in sources[1:])


def _joinable(sources: list) -> bool:
    """Alike ``ArraySource`` parts, each its own, of plain in-memory arrays: not views of a
    memory-mapped file (which cross as it), nor of overlapping elements (windows over a
    series, which cross as the bytes they span: joined, each window was copied whole)."""
    return (_alike_arrays(sources) and len({id(s) for s in sources}) == len(sources)
            and all(type(a) is np.ndarray and memmap_under(a) is None and not overlapping(a)
                    for s in sources for a in s.arrays))


class JoinedArrays:
    """Arrays alike but for their length, to cross to workers as one (their rows one after
    another): the worker payload writes each into its rows of one shared segment; any other
    pickler gets their concatenation.

    Example:
        >>> import pickle
        >>> pickle.loads(pickle.dumps(JoinedArrays([np.arange(2), np.arange(3)]))).tolist()
        [0, 1, 0, 1, 2]
    """

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self.arrays = arrays

    @property
    def shape(self) -> tuple[int, ...]:
        return (sum(len(a) for a in self.arrays), *self.arrays[0].shape[1:])

    @property
    def dtype(self) -> np.dtype:
        return self.arrays[0].dtype

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    def __reduce__(self) -> tuple:
        return np.concatenate, (self.arrays,)


class _JoinedParts(NamedTuple):
    treedef: tree_lib.TreeDef
    leaves: list


def _names(names: Any, count: int, kind: str) -> list[str]:
    """``names=``: one distinct name a source (``jl.mix``'s keys), for messages (a short list
    failed at the first record as an ``IndexError``, hiding the error it named a part for)."""
    listed = [str(n) for n in names] if isinstance(names, Iterable) and not isinstance(
        names, (str, bytes, Mapping)) else []
    if len(listed) != count or len(set(listed)) != count:
        raise ConfigError(
            f"{kind}(names=...): expected one name a source, {count} distinct ones, got "
            f"{names!r:.120}; pass names=['a', 'b', ...] in the sources' order, or leave it out "
            "(jl.mix's: its dict's keys, which must differ as str)")
    return listed
