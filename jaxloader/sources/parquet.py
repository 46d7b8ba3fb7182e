"""``ParquetSource``: the rows of one or many Parquet files, read by row group.

::

    index ──searchsorted(row-group starts)──> (file, row group, row)
          ──> decoded row group (per-process LRU cache, bounded in bytes) ──> the row's columns

The footers are read once, where the source is made (``parquet_footers``); the files are
opened when read (``parquet_files``). Each process keeps the row groups it read last, up to
``cache_bytes``, and ``__getitems__`` reads each row group a batch touches once. Workers share
what they decode (``share_decoded``, Linux: ``shared_blocks``): one decodes a row group into a
memory file the others map. Columns become NumPy as ``arrow_columns`` says; a null raises
naming the column and the file; decoded rows are read-only. Needs ``pyarrow``.

Example:
    >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> path = tempfile.mkdtemp() + "/part-0.parquet"
    >>> pq.write_table(pa.table({"id": [1, 2, 3], "text": ["a", "bb", "ccc"]}), path)
    >>> src = ParquetSource(path)
    >>> len(src), src[2]
    (3, {'id': np.int64(3), 'text': 'ccc'})
"""

from __future__ import annotations

import collections
import importlib
import os
import weakref
from typing import Any, Sequence

import numpy as np

from jaxloader.base.batch_rows import split_rows
from jaxloader.base.checks import Int, check_bool, check_int, int_indices, record_index
from jaxloader.base.errors import SharedMemoryError
from jaxloader.base.loader_names import loader_names
from jaxloader.base.source_locks import OwnLock
from jaxloader.order.local_shuffle import LocalShuffle
from jaxloader.sources.arrow_columns import decode, join, leaves, nbytes_of, pick, runs_order
from jaxloader.sources.joined_groups import JoinedGroups
from jaxloader.sources.parquet_files import ParquetFiles
from jaxloader.sources.paths import expand
from jaxloader.sources import parquet_footers, protocol, shared_blocks
from jaxloader.sources.shared_blocks import SharedBlocks
from jaxloader.base.string_column import StringColumn
from jaxloader.runtime import worker_info
from jaxloader.runtime.worker_info import get_worker_info

_DEFAULT_CACHE_BYTES = 128 << 20  # decoded row groups kept per process (a read-local window's)
_MAX_CACHED_GROUPS = shared_blocks.MAX_CACHED_GROUPS  # (and at most this many)
_MAX_JOINED = 64  # a batch of more row groups is read run by run: a join of them would be
# made again for nearly every batch (a full shuffle); a read-local one reads a window's (8)


@loader_names("source")
class ParquetSource(protocol.Source):
    """Rows of ``paths`` (one path or a list, read in that order; a folder or a glob pattern
    stands for its ``*.parquet`` files, sorted: ``jaxloader.sources.paths``), ``columns`` of
    them (all by default), with at most ``cache_bytes`` of decoded row groups kept per
    process; with ``share_decoded`` (the default) workers decode each row group once for all.

    Example:
        >>> import tempfile, numpy as np, jaxloader as jl, pyarrow as pa, pyarrow.parquet as pq
        >>> path = tempfile.mkdtemp() + "/rows.parquet"
        >>> pq.write_table(pa.table({"id": list(range(100))}), path, row_group_size=10)
        >>> src = jl.ParquetSource(path, cache_bytes=64 << 20)
        >>> with jl.DataLoader(src, batch_size=20, shuffle=jl.LocalShuffle(window=2),
        ...                    num_workers=2, process_index=0, process_count=1) as loader:
        ...     ids = sorted(np.concatenate([b["id"] for b in loader]).tolist())
        >>> ids == list(range(100))
        True
    """

    stamped = 2  # (a kept file's stamp: size, footer: ``fingerprint.file_stamps``)

    def __init__(self, paths: str | os.PathLike | Sequence[str | os.PathLike],
                 columns: str | Sequence[str] | None = None,
                 cache_bytes: Int = _DEFAULT_CACHE_BYTES, share_decoded: bool = True) -> None:
        cache_bytes = check_int("ParquetSource(cache_bytes=...)", cache_bytes, low=0,
                                remedy="a number of bytes (0: no row group kept)")
        self.paths = expand(paths, ".parquet", "ParquetSource", dataset=True)
        footers = parquet_footers.read(self.paths, columns)
        self.columns = footers.columns
        self._files = ParquetFiles(self.paths, footers.identities)  # opened when read
        self._groups = footers.groups
        self._starts = np.concatenate([[0], np.cumsum(footers.rows)]).astype(np.int64)
        rows = footers.rows  # row groups of one size but the last, as a writer's row_group_size
        # makes them (one file's): a row's group is a division (4,096 rows: 10 against 45 us)
        self._group_rows = rows[0] if rows and rows[0] and all(
            r == rows[0] for r in rows[:-1]) and rows[-1] <= rows[0] else 0
        # decoded size, as the footers tell it: whether a batch's row groups fit in the cache
        self._group_bytes = footers.group_bytes
        self._schema_text = footers.schema_text
        self.cache_bytes = cache_bytes
        self.share_decoded = check_bool("ParquetSource(share_decoded)", share_decoded)  # (off
        # where memory files cannot be made: found as the workers' table is, in __getstate__)
        self._table_name: str | None = None  # the shared blocks' table, once workers are made
        self._table_finalizer: weakref.finalize | None = None  # destroys it (main process)
        self._reset_process_state()

    def _reset_process_state(self) -> None:
        """What each process keeps for itself: decoded row groups (``_files`` keeps its open
        files)."""
        self._cache: collections.OrderedDict[int, dict[str, Any]] = collections.OrderedDict()
        self._sizes: dict[int, int] = {}  # the bytes of each cached row group
        self._join: JoinedGroups | None = None  # the last batch's row groups as one table
        self._joins = True  # until a column turns out one that cannot be joined
        self._shared: SharedBlocks | None = None
        self._shared_tried, self._reading = False, OwnLock()  # (see __getitem__)

    def __getstate__(self) -> dict:
        """For a worker: the table of shared row groups is made here, in the main process, the
        first time the source crosses (it lives as long as this object)."""
        if self.share_decoded and self._table_name is None and get_worker_info() is None:
            try:
                table = SharedBlocks.create(len(self._groups))
            except (SharedMemoryError, OSError):
                self.share_decoded = False  # each worker decodes for itself
            else:
                self._table_name = table.name
                self._table_finalizer = weakref.finalize(self, table.destroy)
        state = dict(self.__dict__)
        for key in ("_cache", "_sizes", "_join", "_joins", "_shared", "_shared_tried",
                    "_table_finalizer", "_reading"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._table_finalizer = None
        self._reset_process_state()
        # A worker unpickles its source as it starts: pyarrow's import (~0.2 s) then, and
        # pyarrow.compute's (a list column's first decode's), not in the first batch
        parquet_footers.pyarrow_parquet()
        importlib.import_module("pyarrow.compute")

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def num_row_groups(self) -> int:
        return len(self._groups)

    @property
    def block_starts(self) -> np.ndarray:
        """Where each row group starts, and the row count last (``LocalShuffle``'s blocks)."""
        return self._starts

    def file_identities(self) -> list[tuple[str, list[int]]]:
        """Each file's path and identity (its size and a hash of its footer:
        ``jaxloader.base.file_identity``), as read when the source was made: a loader's state
        holds them, and a restore over a changed file is refused naming it."""
        return list(zip(self.paths, self._files.identities))

    def close(self) -> None:
        """Closes the files this process has open and lets its decoded row groups go, and the
        workers' table of shared row groups with them (a later read opens and decodes again;
        ``DataLoader.close()`` calls it). Idempotent."""
        self._files.close()
        if self._shared is not None:
            self._shared.close()
        self._reset_process_state()
        if self._table_finalizer is not None:
            self._table_finalizer()
            self._table_finalizer = self._table_name = None

    @property
    def fingerprint(self) -> str:
        """The files' names (``path_names``), row counts and schema, which tell other data with
        no read (the files' bytes are named by ``file_identities``)."""
        return parquet_footers.fingerprints(self)[0]

    @property
    def older_fingerprints(self) -> tuple[str | None, ...]:  # (base.abilities.OLDER)
        return parquet_footers.fingerprints(self)[1:]

    def record_origin(self, index: int) -> str:
        """Row ``index``'s file and row there (an error about the record names it)."""
        return parquet_footers.origin(self, index)

    def check_order(self, shuffle: bool | LocalShuffle) -> None:
        """Warns (``PerformanceWarning``) when ``shuffle`` reads from more row groups at once
        than ``cache_bytes`` holds decoded: each batch would decode its row groups again
        (``parquet_footers.check_order``). ``DataLoader`` calls it."""
        parquet_footers.check_order(self, shuffle)

    def lengths(self, key: str) -> np.ndarray:
        """Every row's length of the list column ``key``, from its offsets alone (no value
        converted, no other column read): what ``PackedSource`` needs
        (``parquet_footers.lengths``)."""
        return parquet_footers.lengths(self, key)

    def __getitem__(self, index: int) -> dict[str, Any]:
        index = record_index(index, len(self), "ParquetSource")
        group = int(np.searchsorted(self._starts, index, side="right")) - 1
        with self._reading:  # (read_threads over a wrapper's __getitem__: pyarrow's file and
            decoded = self._decoded(group)  # the cache a thread at a time: a SIGSEGV, EDEADLK)
        row = int(index - self._starts[group])
        return {name: column[row] for name, column in decoded.items()}

    def __getitems__(self, indices: np.ndarray) -> Any:
        """The rows at ``indices`` as a dict of batched columns (each row group decoded once);
        a list of rows when a column holds lists of different lengths."""
        indices = int_indices(indices, len(self), "ParquetSource")
        with self._reading:
            groups = self._groups_of(indices)
            if (gathered := self._gather(indices, groups)) is not None:
                return {name: c.objects() if type(c) is StringColumn else c
                        for name, c in gathered.items()}
            return self._by_runs(indices, groups)

    def gather_columns(self, indices: np.ndarray) -> dict[str, Any] | None:
        """``__getitems__(indices)`` with strings and bytes left as ``StringColumn``s, which
        a worker writes into its slot as they are (``jaxloader.base.string_column``), and numbers
        as ``columns.DeferredTake``s, gathered straight into the slot, when the rows' row groups can
        be joined; else ``None`` (read them with ``__getitems__``). For ``BatchMaker``."""
        indices = np.asarray(indices, dtype=np.int64)  # (the loader's: in range; unchecked)
        with self._reading:
            return self._gather(indices, self._groups_of(indices), lazy=True)

    def _groups_of(self, indices: np.ndarray) -> np.ndarray:
        """The row group of each of ``indices`` (all in range)."""
        if self._group_rows:
            return indices // self._group_rows
        return self._starts.searchsorted(indices, side="right") - 1

    def _gather(self, indices: np.ndarray, groups: np.ndarray,
                lazy: bool = False) -> dict[str, Any] | None:
        """Rows ``indices`` (in row groups ``groups``) from the join of their row groups,
        made first if they are not all in it; ``None`` where no join serves: more row groups
        than ``_MAX_JOINED`` or than a third of the cache holds (a full shuffle of a large
        file; by the footers' estimates, then by the decoded sizes), or a column that cannot
        be joined (``JoinedGroups.of``). A third: the row groups and the join, which counts
        twice (``_evict``), stay within the bound, and the join does not evict the row groups
        it was made from (another worker may be reading them)."""
        join = self._join
        if join is not None:
            rows = join.rows(indices, groups)
            if rows is not None:
                return join.gather(rows, lazy)
            join = None  # held here, it would live beside the next one
        if not self._joins or not len(indices):
            return None
        distinct = np.unique(groups)
        if (len(distinct) > _MAX_JOINED
                or 3 * int(self._group_bytes[distinct].sum()) > self.cache_bytes):
            return None
        listed = distinct.tolist()
        share = self._sharing()
        if share and len(listed) > 1:
            self._fetch_free(listed)
        self._join = None  # its memory goes back to the cache's bound before the decodes
        decoded = [self._decoded(g, share) for g in listed]
        # The footers' sizes are estimates: checked again with the decoded ones (the later may
        # have evicted the first), and the join's, so that it never evicts its row groups
        grouped = sum(nbytes_of(c) for columns in decoded for c in columns.values())
        if 3 * grouped > self.cache_bytes:
            return None
        join = JoinedGroups.of(distinct, decoded, self._starts)
        if join is None:
            self._joins = False  # the same column would stop every join: read by runs
            return None
        if grouped + 2 * join.nbytes > self.cache_bytes:
            return None
        self._join = join
        self._evict()
        rows = join.rows(indices, groups)
        assert rows is not None  # every row group of the batch is joined
        return join.gather(rows, lazy)

    def _by_runs(self, indices: np.ndarray, groups: np.ndarray) -> Any:
        """``__getitems__`` a run of rows of one row group at a time, put back in order."""
        starts = self._starts
        order = None  # file order: nothing to put back
        if len(groups) > 1 and (groups[1:] < groups[:-1]).any():
            order = runs_order(groups)  # (the cached window's runs first)
            groups, indices = groups[order], indices[order]
        local = indices - starts[groups]
        edges = [0, *((groups[1:] != groups[:-1]).nonzero()[0] + 1).tolist(), len(indices)]
        # no rows: empty columns, of the types the first row group has
        runs = groups[edges[:-1]] if len(indices) else np.zeros(1, np.int64)
        # Shared when the batch's row groups fit in the cache (a read-local or file order, or
        # a full shuffle of a file the cache holds): other workers will read them. A batch
        # from more (a full shuffle of a large file) decodes for itself: publishing costs a
        # third of a decode, and the others would rarely find a row group still held.
        share = self._sharing() and (int(self._group_bytes[runs].sum()) <= self.cache_bytes or (
            len(runs) <= 2 and int(self._group_bytes[runs].max()) <= self.cache_bytes))
        if share and len(runs) > 1:
            self._fetch_free(runs.tolist())
        # strings' offsets are read at rows and rows + 1 (as a list for runs of a few rows):
        # computed once for all the runs
        plus, listed = local + 1, local.tolist() if len(runs) > 1 else None
        parts: dict[str, list] = {name: [] for name in self.columns}
        columns = list(parts.items())
        cache = self._cache
        for (a, b), group in zip(zip(edges, edges[1:]), runs.tolist()):  # a run of one group
            decoded = cache.get(group)  # (a full shuffle's batch: ~90 runs of ~3 rows)
            if decoded is None:
                decoded = self._decoded(group, share)
            else:
                cache.move_to_end(group)
            rows = local[a:b]
            for name, out in columns:
                column = decoded[name]
                if type(column) is not np.ndarray:
                    out.append(column.take_span(local, a, b, plus, listed))
                else:  # indexing is quicker for a vector, take for rows of values
                    out.append(column[rows] if column.ndim == 1 else column.take(rows, axis=0))
        batch = {name: join(p) for name, p in columns}
        if order is not None:
            restore = np.empty_like(order)
            restore[order] = np.arange(len(order))
            batch = pick(batch, restore)
        if any(c.dtype.hasobject and len(c) and isinstance(c[0], np.ndarray)
               for c in leaves(batch)):
            return split_rows(batch, len(indices))
        return batch

    def _sharing(self) -> bool:
        """Whether this process reads row groups through the workers' shared blocks."""
        if not self._shared_tried:
            self._shared_tried = True
            info = get_worker_info()
            if self._table_name is not None and info is not None and worker_info.capacity() > 1:
                try:
                    self._shared = SharedBlocks(self._table_name, len(self._groups))
                except (OSError, ValueError):
                    self._shared = None  # the table is gone: decode privately
        return self._shared is not None

    def _fetch_free(self, groups: list[int]) -> None:
        """Decodes first the row groups of ``groups`` that no other worker is decoding now (the
        rest are waited for after), as many as half the cache holds: more would evict those
        fetched first before the batch reads them."""
        room, cache = self.cache_bytes // 2, self._cache
        for group in groups[:_MAX_CACHED_GROUPS // 2]:
            if group in cache:  # (a full shuffle's batch: ~90 row groups, most of them here)
                cache.move_to_end(group)
            elif self._fetch(group, wait=False) is None:
                continue  # another worker is decoding it: read after the others
            room -= self._sizes[group]
            if room <= 0:
                return

    def _decoded(self, group: int, share: bool = True) -> dict[str, Any]:
        """Row group ``group``'s columns (arrays, or ``arrow_columns.ArrowRows``), from the cache if there;
        through the shared blocks if ``share`` and this process reads them."""
        decoded = self._fetch(group, wait=True, share=share)
        assert decoded is not None  # only a fetch that does not wait comes back empty
        return decoded

    def _fetch(self, group: int, wait: bool, share: bool = True) -> dict[str, Any] | None:
        """``_decoded(group, share)``, or ``None`` if ``wait`` is false and another worker is
        decoding that row group now."""
        cached = self._cache.get(group)
        if cached is not None:
            self._cache.move_to_end(group)
            return cached
        shared = share and self._sharing()
        if shared:
            assert self._shared is not None
            table = self._shared.get(group, lambda: self._read(group), wait)
            if table is None:
                return None
        else:
            table = self._read(group)
        path, in_file = self.paths[self._groups[group][0]], self._groups[group][1]
        decoded = {name: decode(table.column(name), name, path, shared, in_file)
                   for name in self.columns}
        # Without workers a Ctrl-C may land here after any call (``jaxloader.base.interrupts``, 7):
        # a size is noted before its row group is cached (one left by an eviction cut short
        # sizes nothing cached, and is never read), and the cached bytes are summed, not
        # counted (a count cut short just after popitem() returned drifted for good).
        self._sizes[group] = sum(nbytes_of(c) for c in decoded.values())
        self._cache[group] = decoded
        self._evict()
        return decoded

    def _evict(self) -> None:
        """Lets the row groups read longest ago go while the cache and the join hold more
        than ``cache_bytes`` (or the cache more than ``_MAX_CACHED_GROUPS``); the last one
        read stays. The join counts twice: the pages of the one before it stay with the
        process's heap until the next join reuses them."""
        cache, sizes, join = self._cache, self._sizes, self._join
        held = sum(sizes[g] for g in cache) + (2 * join.nbytes if join is not None else 0)
        while len(cache) > 1 and (held > self.cache_bytes or len(cache) > _MAX_CACHED_GROUPS):
            evicted_group, _ = cache.popitem(last=False)
            held -= sizes.pop(evicted_group)
            if self._shared is not None:
                self._shared.release(evicted_group)

    def _read(self, group: int) -> Any:
        """Row group ``group`` decoded from its file: a ``pyarrow.Table``."""
        file_number, in_file = self._groups[group]
        return self._files.read(file_number, in_file, self.columns)

    def __repr__(self) -> str:
        return (f"ParquetSource({len(self)} rows in {len(self.paths)} file(s), "
                f"{len(self._groups)} row groups; columns {self.columns})")
