"""``ParquetFiles``: a Parquet source's files, opened when read and checked against what they were.

::

    read(file, row group, columns)
      ├─ a local file: os.stat its path; size, time or inode not as before? its footer again:
      │    the same identity (a copy put in its place): go on; else an error naming the file
      ├─ the file open? at most _MAX_OPEN a process, the least recently used closed first
      │    (opened with the footer this process read before, and page checksums verified)
      └─ read_row_group ── fails? ──> RecordError naming the file, the row group and the column
                                     (the file changed as it was read: named as changed)

Why: a dataset of thousands of files must not hold a descriptor each (a soft limit of 1,024 is
common, and each worker would hold one a file); a file replaced under a running loader must
not be read with the footer of the old one or served through an old handle; a damaged page
must be an error that says where, not a value that is silently wrong (pyarrow verifies a
page's CRC only when asked to). Each process (every worker) opens its own files; nothing
here crosses to a worker but the paths and the identities taken at construction.

Remote files (``gs://``) are opened through ``etils.epath``; they are checked against their
identity when opened, not at every row group (a stat is a round trip there).

Example:
    >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> path = tempfile.mkdtemp() + "/a.parquet"
    >>> pq.write_table(pa.table({"x": [1, 2, 3]}), path, row_group_size=2)
    >>> files = ParquetFiles([path])
    >>> files.read(0, 1, ["x"]).column("x").to_pylist()
    [3]
    >>> files.close()
"""

from __future__ import annotations

import errno
import os
from typing import Any, Callable, Sequence

from jaxloader.base import file_identity
from jaxloader.base.errors import RecordError
from jaxloader.runtime.worker_info import get_worker_info
from jaxloader.sources.open_files import OpenFiles

# Files a process keeps open at once: a read-local order reads one or two files at a time, a
# mixture holds this many a component; far under a 1,024-descriptor limit.
_MAX_OPEN = 8

# Spark's INT96 times read as microseconds (pyarrow's nanoseconds wrapped a 9999-12-31 to
# 1816), then cast to the nanoseconds the footer's schema says, where they fit (``_int96_in_ns``)
_INT96 = {"coerce_int96_timestamp_unit": "us"}


class ParquetFiles:
    """The files at ``paths`` (see the module docstring); their identities are taken here, in
    the process that makes the source."""

    def __init__(self, paths: Sequence[str],
                 identities: Sequence[list[int] | None] | None = None) -> None:
        self.paths = list(paths)
        given = list(identities) if identities is not None else [None] * len(self.paths)
        self.identities = [identity if identity is not None else
                           _checked_open(path, file_identity.parquet)
                           for path, identity in zip(self.paths, given)]
        self._stats = [_stat(path) for path in self.paths]
        self._reset()

    def _reset(self) -> None:
        self._open = OpenFiles(_MAX_OPEN, close=lambda handle: handle.close(force=True))
        self._metas: dict[int, Any] = {}  # footers read in this process, by file
        self._int96: dict[int, dict[str, Any]] = {}  # their INT96 columns' footer types

    def __getstate__(self) -> dict:
        return {"paths": self.paths, "identities": self.identities, "_stats": self._stats}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    def read(self, number: int, group: int, columns: list[str]) -> Any:
        """Row group ``group`` of file ``number``, ``columns`` of it: a ``pyarrow.Table``. In a
        worker, on one thread (the workers are the parallelism, and threads' arenas cost) and
        into a memory pool that gives freed row groups back (``_return_freed_memory``)."""
        self._check(number)
        handle = self.handle(number)
        in_worker = get_worker_info() is not None
        if in_worker:
            _return_freed_memory()
        try:
            table = handle.read_row_group(group, columns=columns, use_threads=not in_worker)
        except (OSError, ValueError, RuntimeError) as e:  # (pyarrow's errors derive from these)
            # a file rewritten as it was read fails as a damaged one would: say which it is
            if file_identity.storage_failed(e):
                raise file_identity.storage_failure("ParquetSource", self.paths[number],
                                                    f"row group {group}", e) from e
            raise self._changed_since(number) or self._undecodable(number, group, columns,
                                                                    e) from e
        except MemoryError as e:  # (pyarrow's ArrowMemoryError: its message names no file)
            meta = self._metas.get(number)
            rows = "" if meta is None else f" of {meta.row_group(group).num_rows:,} rows"
            raise RecordError(
                f"ParquetSource: file {self.paths[number]!r}, row group {group}{rows}, columns "
                f"{columns}: does not fit in this process's memory ({type(e).__name__}: {e}); "
                "write the file with smaller row groups (pyarrow's row_group_size=), or read "
                "fewer columns; a footer that counts more rows than the file holds is damaged"
            ) from e
        counted = handle.metadata.row_group(group).num_rows
        if table.num_rows != counted:  # (a damaged footer: the rows past the data's end would
            raise self._changed_since(number) or RecordError(  # be gathered as its last one)
                f"ParquetSource: file {self.paths[number]!r}, row group {group}: its footer "
                f"counts {counted:,} rows, its data holds {table.num_rows:,}; the file is "
                "damaged: write it again, or leave it out")
        int96 = self._int96.get(number)
        if int96 is None:  # (once a file: each top-level column the footer says otherwise
            read, said = handle.schema_arrow, handle.metadata.schema.to_arrow_schema()  # than
            self._int96[number] = int96 = {  # it is read, an INT96 at any depth: its type)
                field.name: said.field(i).type for i, field in enumerate(read)
                if not field.type.equals(said.field(i).type)}
        return _int96_in_ns(table, int96, self.paths[number], group,
                            lambda names: self._in_ns(number, group, names)) if int96 else table

    def _in_ns(self, number: int, group: int, names: list[str]) -> Any:
        """Columns ``names`` of a row group read as pyarrow reads INT96 by itself: in
        nanoseconds, exact where they fit (times past 1677-2262 wrap: ``_int96_in_ns``)."""
        path, meta = self.paths[number], self._metas.get(number)
        handle = (self._open_remote(number, {}) if "://" in path else _checked_open(
            path, lambda p: open_parquet(p, metadata=meta, page_checksum_verification=True)))
        try:  # (checked as the file read first is: the same file, its pages' checksums)
            return handle.read_row_group(group, columns=names, use_threads=False)
        finally:
            handle.close(force=True)

    def handle(self, number: int) -> Any:
        """File ``number`` as a ``pyarrow.parquet.ParquetFile``, opened if it is not."""
        handle = self._open.get(number)
        if handle is not None:
            return handle
        path = self.paths[number]
        meta = self._metas.get(number)
        if "://" in path:  # checked at each open (no stat a row group there), with one read
            handle = _checked_open(path, lambda p: self._open_remote(number))
        else:
            handle = _checked_open(path, lambda p: open_parquet(
                p, metadata=meta, page_checksum_verification=True, **_INT96))
        self._metas[number] = handle.metadata
        return self._open.add(number, handle)

    def _open_remote(self, number: int, options: dict = _INT96) -> Any:
        """Remote file ``number`` opened, checked against its identity, with its footer from
        the same read of its end (one open and one read: each a round trip)."""
        import pyarrow.parquet as pq

        raw = file_identity.open_binary(self.paths[number])
        try:
            identity, tail = file_identity.parquet_tail(raw)
            if identity != self.identities[number]:  # (before its footer is read: a file
                raise self._changed(number, identity)  # being rewritten is no damaged one)
            meta = self._metas.get(number) or footer_of(tail)
            return pq.ParquetFile(raw, metadata=meta, page_checksum_verification=True,
                                  **options)
        except BaseException:
            raw.close()
            raise

    def close(self) -> None:
        """Closes the open files (a later read opens them again)."""
        self._open.close()

    def _check(self, number: int) -> None:
        """Raises if local file ``number`` is no longer the one read at construction."""
        before = self._stats[number]
        if before is None:
            return
        now = _stat(self.paths[number])
        if now == before:
            return
        identity = _checked_open(self.paths[number], file_identity.parquet)
        if identity != self.identities[number]:
            raise self._changed(number, identity)
        self._stats[number] = now  # the same bytes (a copy put in place): read the new file
        self._open.drop(number)

    def _changed_since(self, number: int) -> RecordError | None:
        """After a read that failed: the error for a local file no longer the one checked before
        the read (replaced, or being written), else ``None``."""
        before = self._stats[number]
        try:
            if before is None or _stat(self.paths[number]) == before:
                return None
            identity = file_identity.parquet(self.paths[number])
        except Exception:  # noqa: BLE001 - gone, or its footer not written yet: being written
            return self._changed(number, None)
        return None if identity == self.identities[number] else self._changed(number, identity)

    def _changed(self, number: int, identity: list[int] | None) -> RecordError:
        return file_identity.changed_error("ParquetSource", self.paths[number],
                                           self.identities[number], identity, "rows")

    def _undecodable(self, number: int, group: int, columns: list[str],
                     error: Exception) -> RecordError:
        """The error for a row group that cannot be read: which column, found by reading them
        one by one."""
        handle = self._open.get(number)  # (the read that failed opened it)
        bad = None
        for name in columns if len(columns) > 1 else ():
            if handle is None:
                break
            try:
                handle.read_row_group(group, columns=[name], use_threads=False)
            except Exception:  # noqa: BLE001 - the one that fails is the one to name
                bad = name
                break
        meta = self._metas.get(number)
        rows = ""
        if meta is not None:
            first = sum(meta.row_group(g).num_rows for g in range(group))
            rows = f" (rows {first:,}..{first + meta.row_group(group).num_rows - 1:,} of the file)"
        where = f"column {bad!r}" if bad is not None else f"columns {columns}"
        return RecordError(
            f"ParquetSource: file {self.paths[number]!r}, row group {group}{rows}, {where}: "
            f"cannot be decoded ({type(error).__name__}: {error}): the file is damaged, or the "
            "storage failed to read it (a disk or network error: try again); replace a damaged "
            "file (download or write it again), or leave it out of the source's paths")




def _int96_in_ns(table: Any, int96: dict[str, Any], path: str, group: int,
                 in_ns: Callable[[list[str]], Any]) -> Any:
    """``table`` with its ``int96`` columns (read as microseconds, at any depth of a struct or
    list) of the types the footer says (nanoseconds, as before): read again so (``in_ns``:
    exact, their digits past the microsecond kept) once the microseconds say each fits; a
    time nanoseconds cannot hold (before 1677, after 2262) refused, named, with the remedy."""
    import pyarrow as pa

    names = [name for name in table.column_names if name in int96]
    for name in names:
        column = table.column(name)
        try:
            table = table.set_column(table.column_names.index(name), name,
                                     column.cast(int96[name]))
        except pa.ArrowInvalid:
            import pyarrow.compute as pc

            held = ("before 1677 or after 2262" if not pa.types.is_timestamp(column.type) else
                    "from {} to {}".format(*pc.min_max(column).values()))
            raise RecordError(
                f"ParquetSource: column {name!r} of {path!r}, row group {group}, holds INT96 "
                f"times (Spark's default) {held}, which datetime64[ns] cannot "
                "hold (1677-09-21 to 2262-04-11: pyarrow wraps it, 9999-12-31 read as "
                "1816-03-29); write it as microseconds (Spark: spark.sql.parquet."
                "outputTimestampType=TIMESTAMP_MICROS; pyarrow: coerce_timestamps='us'), "
                "or leave it out with columns=") from None
    if names:
        exact = in_ns(names)
        for name in names:
            table = table.set_column(table.column_names.index(name), name, exact.column(name))
    return table


def open_parquet(path: str, **options: Any) -> Any:
    """``path`` as a ``pyarrow.parquet.ParquetFile`` (``options`` its own), a remote one
    through ``etils.epath``, the path layer Orbax uses."""
    import pyarrow.parquet as pq

    if "://" not in path:
        return pq.ParquetFile(path, **options)
    raw = file_identity.open_binary(path)
    try:
        return pq.ParquetFile(raw, **options)
    except BaseException:
        raw.close()
        raise


def remote_footer(raw: Any) -> tuple[Any, list[int]]:
    """The footer and identity (``file_identity.parquet``) of the remote Parquet file open as
    ``raw``, from one read of its end."""
    identity, tail = file_identity.parquet_tail(raw)
    return footer_of(tail), identity


def footer_of(tail: bytes) -> Any:
    """The footer a Parquet file's last bytes hold (``file_identity.parquet_tail``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pq.read_metadata(pa.BufferReader(tail))


def _stat(path: str) -> tuple[int, int, int] | None:
    """``file_identity.stat``; an error naming the file and the remedy where it is gone."""
    try:
        return file_identity.stat(path)
    except OSError as e:
        raise open_error(path, e) from None


def _checked_open(path: str, use: Any) -> Any:
    """``use(path)`` (which opens the file); an ``OSError`` naming the file and the remedy."""
    try:
        return use(path)
    except FileNotFoundError as e:
        raise open_error(path, e) from None
    except PermissionError as e:
        raise open_error(path, e) from None
    except OSError as e:
        if not file_identity.storage_failed(e):
            raise
        raise file_identity.storage_failure("ParquetSource", path, "the file", e) from e


def open_error(path: str, error: OSError) -> OSError:
    """The error for a file that cannot be opened: a ``PermissionError`` naming the permission
    it lacks and who may read the file; a vanished file named as such."""
    if isinstance(error, PermissionError) or error.errno in (errno.EACCES, errno.EPERM):
        owner = ""
        try:
            found = os.stat(path)
            owner = f", mode {found.st_mode & 0o777:o}, owner uid {found.st_uid}"
        except OSError:
            owner = " (its folder cannot be searched either)"
        return PermissionError(
            errno.EACCES, f"ParquetSource: no permission to read this file{owner}; this "
            f"process runs as uid {os.geteuid()}: grant read permission (chmod a+r), or run as "
            "a user who may read it", path)
    if isinstance(error, FileNotFoundError):
        return FileNotFoundError(
            errno.ENOENT, "ParquetSource: the file is gone (deleted or moved since the source "
            "was made); put it back, or make a new source and loader over the files there are"
            f"{file_identity.not_on_this_node(path)}", path)
    return error


_POOL_SET = False


def _return_freed_memory() -> None:
    """In a worker process (ours alone): an Arrow memory pool that gives freed row groups
    back to the system. Arrow's default (mimalloc) keeps them, and a worker's private memory
    grows by a cache's worth; jemalloc set to return pages at once, or the
    system allocator where jemalloc is not built in, give them back."""
    global _POOL_SET
    if _POOL_SET:
        return
    _POOL_SET = True
    import pyarrow as pa

    try:
        pool = pa.jemalloc_memory_pool()
        pa.jemalloc_set_decay_ms(0)
    except (NotImplementedError, AttributeError):
        pool = pa.system_memory_pool()
    pa.set_memory_pool(pool)
