"""A Parquet source's footers, read once where the source is made, and what a loader asks of
them: the schema every file must share, the columns to read, each row group's rows and decoded
size; whether an order's row groups fit the cache (``check_order``); a list column's lengths
without its values (``lengths``).

Example:
    >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> path = tempfile.mkdtemp() + "/a.parquet"
    >>> pq.write_table(pa.table({"id": [1, 2, 3]}), path, row_group_size=2)
    >>> footers = read([path], None)
    >>> footers.columns, footers.rows
    (['id'], [2, 1])
"""

from __future__ import annotations

import collections
import concurrent.futures
import difflib
import re
import warnings
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import numpy as np

from jaxloader.base import file_identity
from jaxloader.base.errors import ConfigError, PerformanceWarning, user_stacklevel
from jaxloader.order.local_shuffle import LocalShuffle
from jaxloader.sources.parquet_checks import check_chosen, check_nulls, check_rows
from jaxloader.sources.parquet_files import open_error, open_parquet, remote_footer
from jaxloader.sources.paths import files_fingerprints
from jaxloader.sources.shared_blocks import MAX_CACHED_GROUPS

_REMOTE_READS = 16  # footers of remote files read at once where a source is made


class Footers(NamedTuple):
    """What the files' footers say, in reading order."""

    columns: list[str]
    groups: list[tuple[int, int]]  # (file, row group in it), a row group each
    rows: list[int]
    group_bytes: np.ndarray  # each row group's decoded size of the columns read
    schema_text: tuple[str, str]  # (the Parquet columns', the Arrow schema's as it prints)
    identities: list[list[int] | None]  # a remote file's, read with its footer; or None


def read(paths: Sequence[str], columns: str | Sequence[str] | None) -> Footers:
    """The footers of ``paths``; an error naming the file and the fields where a file's schema
    differs from the first file's, or a column the files lack."""
    pyarrow_parquet()  # (an error that says to install it, before any file is read)
    found = _footers(paths)
    metas = [meta for meta, _ in found]  # (the first file with rows is the one to match: a
    first = next((i for i, meta in enumerate(metas) if meta.num_rows), 0)  # pandas' empty
    schemas = [meta.schema.to_arrow_schema() for meta in metas]  # (each file's, once)
    schema = schemas[first]  # part has columns of no type)
    available = list(schema.names)
    known, labels = set(available), _pandas_row_labels(schema)  # (lists: 40,000 columns 48 s)
    if isinstance(columns, str):  # one column by name (list("text") would be 4 names)
        columns = [columns]
    if isinstance(columns, (set, frozenset)) and len(columns) > 1:  # (the hash seed's order)
        listed = sorted(columns, key=str)
        raise ConfigError(
            f"ParquetSource(columns=...): got a set, {listed!r}, whose order differs from run "
            "to run (the batch's keys and the source's fingerprint follow it: a state saved "
            f"in one run is refused in the next); pass a list: columns={listed!r}")
    given = columns
    columns = list(columns) if isinstance(columns, Iterable) else columns
    if columns is not None and not (isinstance(columns, list) and all(
            isinstance(c, str) for c in columns)):
        raise ConfigError(f"ParquetSource(columns): expected a column's name or a list of "
                          f"names, got {given!r:.80}; e.g. columns=['text', 'label'], or "
                          "None for every column")
    if columns is not None and not columns:
        raise ConfigError("ParquetSource(columns=[]): expected the names of the columns to "
                          "read, at least one; None reads them all")
    counts = collections.Counter(columns or ())  # (40,000 columns: counted once)
    twice = next((c for c in columns or () if counts[c] > 1), None)
    if twice is not None:  # (a record holds it once: the repr and fingerprint said twice)
        raise ConfigError(f"ParquetSource(columns=...): {twice!r} is named twice in {columns}; "
                          "name each column once")
    chosen = list(columns) if columns is not None else [
        c for c in available if c not in labels]
    check_chosen(paths, metas, schemas, first, chosen)
    wanted = [schema.field(c) for c in chosen]
    for path, meta, other in [(p, m, o) for i, (p, m, o) in enumerate(zip(paths, metas, schemas))
                              if i != first and m.num_rows]:  # (a file of no rows gives none:
        names, other_labels = set(other.names), _pandas_row_labels(other)  # an empty part's
        differ = [f"{f.name}: {f.type} in {paths[first]!r}, "  # columns of no type, or of
                  f"{other.field(f.name).type if f.name in names else 'missing'} here"  # its
                  for f in wanted if f.name not in names or not _alike(  # own empty frame's)
                      other.field(f.name).type).equals(_alike(f.type))]
        if columns is None:  # (all of them: one only a later file has was left out, silently)
            differ += [f"{name}: missing in {paths[first]!r}, {other.field(name).type} here"
                       for name in other.names if name not in known
                       and name not in other_labels]
        if differ:
            raise ConfigError(
                f"ParquetSource: file {path!r} has another schema than the first file with "
                "rows: "
                + "; ".join(differ) + "; read the files in separate sources (and "
                "ConcatSource them after a Map that makes them alike), or pass columns= "
                "those they share"
            )
    groups = [(f, g) for f, meta in enumerate(metas) for g in range(meta.num_row_groups)]
    for path, meta, other in zip(paths, metas, schemas):
        check_nulls(path, meta, chosen, other)
    rows = [metas[f].row_group(g).num_rows for f, g in groups]
    check_rows(paths, metas, rows)
    return Footers(chosen, groups, rows,
                   np.array([_decoded_bytes(metas[f].row_group(g), chosen) for f, g in groups],
                            dtype=np.int64), (_columns_text(metas[first].schema), str(schema)),
                   [identity for _, identity in found])


def _alike(kind: Any) -> Any:
    """``kind`` with what is only Arrow's encoding made one: ``large_string`` and
    ``string_view`` a ``string`` (pandas 3 writes the first, Spark and ``datasets`` the last),
    the binary ones ``binary``, ``large_list`` a ``list``, a dictionary its values (a pandas
    categorical's index width follows its count): the values read are the same."""
    import pyarrow as pa

    if pa.types.is_dictionary(kind):
        return _alike(kind.value_type)
    if pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind):
        return pa.binary()
    if pa.types.is_large_list(kind) or pa.types.is_list_view(kind):
        return pa.list_(_alike(kind.value_type))
    if pa.types.is_list(kind):
        return pa.list_(_alike(kind.value_type))
    if pa.types.is_fixed_size_list(kind):  # (a map's and a fixed list's items too: the audit)
        return pa.list_(_alike(kind.value_type), kind.list_size)
    if pa.types.is_map(kind):
        return pa.map_(_alike(kind.key_type), _alike(kind.item_type))
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_alike(f.type)) for f in kind])
    return kind


def _columns_text(schema: Any) -> str:
    """The Parquet schema's columns (``pyarrow.parquet.ParquetSchema``: path, physical and
    logical type, levels), for a fingerprint: the Arrow schema's text shows an extension type
    (a ``datasets`` Array2D) only where the module that registers it was imported, so a
    training script that imports ``datasets`` and a resume script that does not would see
    other data."""
    return "\n".join(str(column) for column in schema)


def fingerprints(source: Any) -> tuple[str, ...]:
    """A ``ParquetSource``'s fingerprint, then its older ones: of the Arrow schema's text
    (before 2026-11-29), and of the whole paths too (before 2026-11-28; ``files_fingerprints``)."""
    columns, shown = source._schema_text
    parts = (source._starts.tobytes(), "\0".join(source.columns))
    now = files_fingerprints("parquet", len(source), source.paths, parts[0], columns, parts[1])
    return now[0], *files_fingerprints("parquet", len(source), source.paths, parts[0], shown,
                                       parts[1])


def check_order(source: Any, shuffle: Any,
                told: tuple[int, Callable[[int], tuple[str, str]]] | None = None) -> None:
    """``ParquetSource.check_order``: a ``PerformanceWarning`` when ``shuffle`` reads from more
    row groups at once than ``source.cache_bytes`` holds decoded (the footers' sizes) or than
    ``MAX_CACHED_GROUPS``, with the remedy: a row group evicted before its window is done is
    decoded again. ``told``: for an order of rows made from the files' records (a
    ``PackedSource``'s), how many row groups it reads at once, and, from how many the cache
    holds, what it is and the remedy (asked where it warns: ``derived.packed_order``).

    Example:
        >>> import tempfile, warnings, jaxloader as jl, pyarrow as pa, pyarrow.parquet as pq
        >>> path = tempfile.mkdtemp() + "/rows.parquet"
        >>> pq.write_table(pa.table({"x": np.arange(10_000.0)}), path, row_group_size=1_000)
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     jl.ParquetSource(path, cache_bytes=16 << 10).check_order(True)
        >>> caught[0].category.__name__
        'PerformanceWarning'
    """
    sizes = source._group_bytes
    # the most row groups the cache holds, the largest ones: the window to advise
    fits = min(MAX_CACHED_GROUPS, int(np.searchsorted(np.cumsum(np.sort(sizes)[::-1]),
                                                      source.cache_bytes, side="right")))
    if told is not None:
        count, what_and_remedy = min(told[0], len(sizes)), told[1]
    elif isinstance(shuffle, LocalShuffle):  # a window of blocks, each in 1 row group or
        blocks = shuffle.block_starts(source, len(source))  # more (blocks of records)
        first = source._starts.searchsorted(blocks[:-1], side="right")
        spans = np.sort(source._starts.searchsorted(blocks[1:] - 1, side="right") - first + 1)
        count = min(len(sizes), int(spans[max(0, len(spans) - shuffle.window):].sum()))
        what = f"{shuffle!r} reads up to {count} row group(s) at a time"
        window = fits // max(1, int(spans[-1])) if len(spans) else 0
        remedy = (f"or a smaller window (window={window} fits)" if window else
                  "(not one block fits: a window of 1 needs that much too)")
    elif shuffle:
        count = len(sizes)
        what = f"a full shuffle (shuffle=True) reads from all {count} row groups at once"
        remedy = (f"or shuffle=jl.LocalShuffle(window={fits}), which reads {fits} row group(s) "
                  "at a time, as many as it holds (docs/files.md)" if fits else "(not one "
                  "row group fits: LocalShuffle needs that much too)")
    else:
        return  # (file order: a row group at a time)
    held = int(np.sort(sizes)[len(sizes) - count:].sum())
    if held > source.cache_bytes or count > MAX_CACHED_GROUPS:
        if told is not None:
            what, remedy = what_and_remedy(fits)
        cache, size = (f"up to {held:,} bytes decoded (the footers' sizes), more than the "
                       "cache holds", f"pass cache_bytes= at least {held:,} (each worker "
                       "holds that much)") if count <= MAX_CACHED_GROUPS else (
            f"more row groups than the {MAX_CACHED_GROUPS} a process keeps decoded, whatever "
            f"cache_bytes", f"write the files with fewer, larger row groups (pyarrow's "
            f"row_group_size=; {len(sizes):,} now, {sum(sizes) // len(sizes):,} bytes each)")
        warnings.warn(
            f"ParquetSource(cache_bytes={source.cache_bytes:,}): {what}, {cache}: each batch "
            f"decodes its row groups again, tens to hundreds of times slower; {size} {remedy}",
            PerformanceWarning, stacklevel=user_stacklevel())  # (the DataLoader(...))


def lengths(source: Any, key: str) -> np.ndarray:
    """``ParquetSource.lengths``: every row's length of the list column ``key`` (of any
    values: token ids, audio samples, or frames of lists, each one), from its offsets alone.

    Example:
        >>> import tempfile, jaxloader as jl, pyarrow as pa, pyarrow.parquet as pq
        >>> path = tempfile.mkdtemp() + "/tokens.parquet"
        >>> pq.write_table(pa.table({"tokens": [[5, 8, 13], [1], [2, 3]]}), path)
        >>> jl.ParquetSource(path).lengths("tokens").tolist()
        [3, 1, 2]
    """
    import pyarrow as pa

    # the type in the first file with rows, as the source matched them (pandas writes an empty
    # part whose column has no type, or none); row groups of no rows have no lengths to read
    rows = np.diff(source._starts)
    first = source._groups[int(np.argmax(rows > 0))][0] if rows.any() else 0
    schema = metadata(source.paths[first]).schema.to_arrow_schema()
    kind = schema.field(key).type if key in source.columns else None
    if kind is None:
        close = difflib.get_close_matches(key, source.columns, n=1)
        raise ConfigError(
            f"ParquetSource.lengths({key!r}): no such column among {source.columns}; name one "
            "of them" + (f" ({close[0]!r}?)" if close else ""))
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)
            or pa.types.is_fixed_size_list(kind)):
        raise ConfigError(
            f"ParquetSource.lengths({key!r}): expected a column of lists (token ids, samples, "
            f"feature frames), got {kind}; write the column as lists, or measure the lengths "
            "from the records (PackedSource: pass lengths=)")
    out = []
    for group in np.flatnonzero(rows).tolist():
        file_number, in_file = source._groups[group]
        array = source._files.read(file_number, in_file, [key]).column(0).combine_chunks()
        if array.null_count:
            raise ConfigError(
                f"ParquetSource: column {key!r} of {source.paths[file_number]!r} has "
                f"{array.null_count} null list(s) in row group {in_file}; fill them when "
                "writing the file (an empty list for a record with none)")
        if pa.types.is_fixed_size_list(kind):
            out.append(np.full(len(array), kind.list_size, np.int64))
        else:
            out.append(np.diff(np.asarray(array.offsets)).astype(np.int64))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def origin(source: Any, index: int) -> str:
    """``ParquetSource.record_origin``: row ``index``'s file and its row in that file."""
    group = int(np.searchsorted(source._starts, index, side="right")) - 1
    file_number = source._groups[group][0]
    first = next(g for g, (f, _) in enumerate(source._groups) if f == file_number)
    return f"{source.paths[file_number]} row {index - int(source._starts[first])}"


def pyarrow_parquet() -> Any:
    """``pyarrow.parquet``, or an error that says how to install it."""
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ConfigError(
            "ParquetSource needs pyarrow, which is not installed: pip install "
            "\"jaxloader[parquet]\" (or pip install pyarrow)"
        ) from e
    return pq


def _footers(paths: Sequence[str]) -> list[tuple[Any, list[int] | None]]:
    """``footer`` of each path, in order; on threads where a file is remote (a round trip
    each: a thousand files at 50 ms are 50 s one by one)."""
    if sum("://" in path for path in paths) < 2:
        return [footer(path) for path in paths]
    with concurrent.futures.ThreadPoolExecutor(min(_REMOTE_READS, len(paths))) as pool:
        return list(pool.map(footer, paths))


def metadata(path: str) -> Any:
    """The footer of the Parquet file at ``path``; an error naming it if it is none."""
    return footer(path)[0]


def footer(path: str) -> tuple[Any, list[int] | None]:
    """The footer of the Parquet file at ``path`` and, for a remote one, its identity
    (``file_identity.parquet``), both from one open and read; an error naming the file if it
    is none."""
    import pyarrow as pa

    pattern = path.rstrip("/") + "/*.parquet"  # what to pass for a remote folder
    try:
        if "://" in path:
            with file_identity.open_binary(path) as raw:
                return remote_footer(raw)
        handle = open_parquet(path)
        try:
            return handle.metadata, None
        finally:
            handle.close(force=True)
    except PermissionError as e:
        raise open_error(path, e) from None
    except FileNotFoundError:  # (a bucket's store may say so of a folder)
        folder = (f"; if it is a remote folder, pass a pattern: {pattern!r}"
                  if "://" in path and not path.endswith(".parquet") else "")
        raise ConfigError(
            f"ParquetSource: file {path!r} does not exist; check the path{folder}") from None
    except IsADirectoryError:  # a remote folder (local ones are listed by paths.expand)
        raise ConfigError(
            f"ParquetSource: {path!r} is a folder; remote folders are not listed: pass a "
            f"pattern, {pattern!r}, or the files' paths"
        ) from None
    except (pa.ArrowInvalid, OSError) as e:
        if file_identity.storage_failed(e):
            raise file_identity.storage_failure("ParquetSource", path, "its footer",
                                                e) from e  # (OSError: e is one)
        raise ConfigError(
            f"ParquetSource: file {path!r} is not a Parquet file ({e}); pass Parquet files "
            "only (FileListSource reads other files as bytes); a Parquet file cut short or "
            "damaged (a copy or download that failed) has no footer: copy it again"
        ) from None


def _pandas_row_labels(schema: Any) -> set[str]:
    """The columns in which pandas stored a DataFrame's unnamed row labels
    (``__index_level_0__``, written by ``df.to_parquet()`` for any index but a range): not
    data, so ``columns=None`` leaves them out (name one in ``columns=`` to read it). A named
    index (``df.set_index("id")``) is the user's data and stays."""
    try:
        labels = (schema.pandas_metadata or {}).get("index_columns", [])
    except (ValueError, TypeError):  # metadata that is not pandas' JSON
        return set()
    return {c for c in labels if isinstance(c, str) and re.fullmatch(r"__index_level_\d+__", c)}


def _decoded_bytes(row_group: Any, columns: list[str]) -> int:
    """The decoded size of ``columns`` of a row group, as its footer tells it (``_chunk_bytes``)."""
    read, prefixes = set(columns), tuple(f"{name}." for name in columns)
    chunks = (row_group.column(i) for i in range(row_group.num_columns))
    return sum(_chunk_bytes(chunk) for chunk in chunks
               if chunk.path_in_schema in read or chunk.path_in_schema.startswith(prefixes))


_WIDTHS = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}


def _chunk_bytes(chunk: Any) -> int:
    """A column chunk's decoded size: its uncompressed size, or more where its values are
    stored smaller than they decode (a dictionary's indices, runs: a label of 10 classes, a
    string repeated, 200 KB decoded from a 660-byte chunk): fixed-width values at their width,
    a dictionary's strings, where its data pages (the chunk less its dictionary page) hold under
    plain pages' 4 bytes a value (pyarrow names the dictionary of a chunk that fell back to
    plain pages too), at the mean length of its statistics' least and greatest (more is a
    warning too many; less, a slow shuffle unwarned)."""
    size, width = chunk.total_uncompressed_size, _WIDTHS.get(chunk.physical_type)
    if width is not None:
        return max(size, chunk.num_values * width)
    stats, values = chunk.statistics, chunk.num_values
    if chunk.physical_type != "BYTE_ARRAY" or stats is None or not stats.has_min_max or \
            not chunk.has_dictionary_page or chunk.total_compressed_size - (
                chunk.data_page_offset - chunk.dictionary_page_offset) >= 4 * values:
        return size
    mean = (len(stats.min_raw) + len(stats.max_raw)) // 2  # (bytes: not all text decodes)
    return max(size, values * (4 + mean))  # (4: a string's offset)
