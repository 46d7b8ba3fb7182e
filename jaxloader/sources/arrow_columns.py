"""A row group's Arrow columns as NumPy, and a batch's column from its runs.

::

    Arrow column ──decode──> a read-only NumPy array (numbers: a view of Arrow's buffer;
                             lists of one length: one more axis a depth)
                         └─> ArrowRows (strings, bytes, ragged lists: the row offsets and what
                             they point into) ──take(rows)──> str / bytes / arrays, rows only
                         └─> ArrowStruct (structs: each field decoded as a column) ──> dicts
    runs of one batch ──join──> one column

No pyarrow call is made a batch, and none that imports pandas (pyarrow's ``to_numpy``,
``pa.array`` and ``take`` do, 27 MiB a worker): only what a row group is decoded with.

Example:
    >>> import pyarrow as pa
    >>> text = decode(pa.chunked_array([["a", "bé", "c"]]), "text", "f.parquet")
    >>> text.take(np.array([1, 2]))
    ['bé', 'c']
"""

from __future__ import annotations

import itertools
import sys
from typing import Any, Iterator, cast

import numpy as np

from jaxloader.base.columns import object_column
from jaxloader.base.errors import ConfigError
from jaxloader.sources.arrow_numpy import is_list, no_rows, numpy_of


def decode(column: Any, name: str, path: str, compact: bool = False,
           group: int | None = None) -> Any:
    """One column of a row group (``group`` of its file, which an error names): a read-only
    NumPy array, ``ArrowRows`` for strings, bytes and ragged lists, or ``ArrowStruct`` for a
    struct. A column read from a file is copied into one compact chunk (the reader's buffers
    hold more than their rows); a ``compact`` one (in shared memory) is kept as it is."""
    array = column.chunk(0) if compact and column.num_chunks == 1 else column.combine_chunks()
    return _decode_array(array, name, path, group=group)


def _values(array: Any) -> Any:
    """A list array's values, its rows' only (a slice's, not its whole buffer), as
    ``flatten()`` gives them; a fixed-size list without nulls by slicing its child, with no
    compute call (4.5 against 12 us a column, twice a row group and worker)."""
    import pyarrow as pa

    if pa.types.is_fixed_size_list(array.type) and not array.null_count:
        size = array.type.list_size
        return array.values.slice(array.offset * size, len(array) * size)
    return array.flatten()


def nested_nulls(array: Any) -> int:
    """The nulls among a list column's values, at any depth, its structs' fields too (a null
    there would turn integers into floats in Arrow's conversion, in the row groups that hold
    one, or come out as ``None``)."""
    import pyarrow as pa

    def listed(kind: Any) -> bool:  # (a map is a list of key and item structs)
        return is_list(kind) or pa.types.is_map(kind)

    if not listed(array.type):  # (a struct's fields are decoded, and named, one by one)
        return 0
    count, inside = 0, [array]
    while inside:
        array = inside.pop()
        seen = 0  # (a null struct's fields are null there too: counted once, as the struct)
        if pa.types.is_map(array.type):  # (its key and item structs: no list_flatten)
            start, stop = (array.offsets[0].as_py(), array.offsets[-1].as_py()) if len(
                array) else (0, 0)
            parts = [array.values.slice(start, stop - start)]
        elif is_list(array.type):
            parts = [_values(array)]
        elif pa.types.is_struct(array.type):
            parts, seen = array.flatten(), array.null_count
        else:
            continue
        count += sum(part.null_count - seen for part in parts)
        inside += parts
    return count


def null_message(name: str, path: str, nulls: str, column: str | None = None,
                 floats: bool = False) -> str:
    """The error's message for ``nulls`` (their count and where) in column ``name`` of the file at
    ``path``, found as a row group is decoded or in the file's footer, with the remedy;
    ``column``: the column read that holds it (a struct field's; ``None``: ``name`` itself).

    Example:
        >>> print(null_message("img.path", "f.parquet", "2 null value(s)", "img"))
        ... # doctest: +ELLIPSIS
        ParquetSource: column 'img.path' of 'f.parquet' has 2 null value(s); ... 'img' out ...
    """
    top = column or name  # (a struct's field: columns= names its column)
    media = (f"; {top!r} looks like a Hugging Face Image or Audio column (bytes and a path "
             "that may be null): read the files with datasets.load_dataset('parquet', "
             "data_files=...) and pass the Dataset, which knows the feature"
             if name.endswith(".path") else "")
    nan = ("; pandas writes a float NaN as a null (df.to_parquet, pa.Table.from_pandas): to "
           "keep NaN, write that column as pa.array(df[name].to_numpy(), from_pandas=False)"
           if floats else "")
    return (f"ParquetSource: column {name!r} of {path!r} has {nulls}; fill them when writing "
            f"the file, or leave the column {top!r} out with columns={media}{nan}")


def _decode_array(array: Any, name: str, path: str, column: str | None = None,
                  group: int | None = None) -> Any:
    """``decode`` of one Arrow array: lists of one length at every depth become one axis a
    depth (a list of lists of 3 numbers, 2 a row: rows of shape (2, 3)); a struct's fields
    are decoded as columns (``ArrowStruct``), named ``column.field``."""
    import pyarrow as pa

    nulls = array.null_count
    where = "" if nulls else " inside its lists"
    nulls = nulls or nested_nulls(array)
    if nulls:
        if group is not None:  # (found as read: a file written without statistics)
            first = np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))
            where += f" in row group {group}" + (f", the first at its row {first[0]}"
                                                  if len(first) else "")
        raise ConfigError(null_message(name, path, f"{nulls} null value(s){where}", column,
                                       floats=pa.types.is_floating(array.type)))
    kind = array.type
    if pa.types.is_map(kind):  # (before its list's branch: it is one)
        return ArrowRows(array, ragged=True, where=f"column {name!r} of {path!r}",
                         values=_pairs(array.values))
    if pa.types.is_dictionary(kind):  # (a pandas categorical: its values, as a column of them
        return _decode_array(array.dictionary_decode(), name, path, column,  # is decoded)
                             group)
    if pa.types.is_struct(kind):
        return ArrowStruct({kind.field(i).name: _decode_array(field, f"{name}.{kind.field(i).name}",
                                                              path, column or name, group)
                            for i, field in enumerate(array.flatten())})
    if is_list(kind) and not len(array) and (empty := no_rows(kind)) is not None:
        return empty
    if is_list(kind):
        if pa.types.is_fixed_size_list(kind):  # (no offsets to check: ~100 us a row group)
            size = kind.list_size
        else:
            lengths = np.diff(numpy_of(array.offsets))
            size = int(lengths[0]) if len(lengths) and np.all(lengths == lengths[0]) else None
        if size is None:  # (its rows slice the values at Arrow's offsets: all of them)
            return ArrowRows(array, ragged=True, where=f"column {name!r} of {path!r}",
                             values=_inner(array.values, name, path, column))
        values = _inner(_values(array), name, path, column)
        out = values.reshape(len(array), size, *values.shape[1:])
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(
            kind) or pa.types.is_large_binary(kind):
        return ArrowRows(array, ragged=False, where=f"column {name!r} of {path!r}")
    elif isinstance(kind, pa.BaseExtensionType) and hasattr(array, "to_numpy_ndarray"):
        out = np.asarray(array.to_numpy_ndarray())  # (a fixed-shape tensor: rows of its shape)
    else:
        out = numpy_of(array)
    out.flags.writeable = False
    return out


def _inner(values: Any, name: str, path: str, column: str | None) -> np.ndarray:
    """A list column's values as NumPy: lists of one length inside one more axis a depth,
    inner lists of other lengths an array a row."""
    decoded = _decode_array(values, name, path, column) if is_list(values.type) else None
    return decoded if isinstance(decoded, np.ndarray) else numpy_of(values)


def _pairs(entries: Any) -> np.ndarray:
    """A map's entries (its key and item struct array) as an object array of ``(key, value)``
    tuples, Arrow's own Python values (``dict(row)`` a dict, as of pyarrow's list of them):
    a row is then one leaf, an object array, batched the same with a ``Map`` or without, where
    a Python list of tuples was a pytree a ``Map`` returning the record batched by entry
    position (keys made arrays, rows of other lengths refused), and no ``Map`` an object
    array of lists."""
    keys, items = entries.field(0).to_pylist(), entries.field(1).to_pylist()
    out = np.empty(len(keys), object)
    for i, pair in enumerate(zip(keys, items)):  # (assigned one by one: a list of tuples
        out[i] = pair  # given at once would make a 2-D array)
    return out


_NO_BYTES = np.zeros(0, np.uint8)
_FEW_ROWS = 16  # up to here a run's offsets are read one by one: fewer Python calls than the
# four NumPy calls of a longer run cost


class ArrowRows:
    """A column of strings, bytes or ragged lists as the cache keeps it: the row offsets and
    what they point into (Arrow's values, or the bytes: a view of Arrow's buffer, which a
    batch gathered by NumPy calls reads as it is; made into one ``bytes`` or ``str`` the first
    time rows are sliced one by one), a tenth of the memory of Python objects a row; objects
    are made only for the rows read, with no Arrow call."""

    def __init__(self, array: Any, ragged: bool, where: str = "a column",
                 values: np.ndarray | None = None) -> None:
        import pyarrow as pa

        self.where = where  # (named in errors)
        kind = array.type
        large = pa.types.is_large_string(kind) or pa.types.is_large_binary(kind) or (
            pa.types.is_large_list(kind))
        width = np.dtype("<i8" if large else "<i4")
        # row r is [starts[r], starts[r + 1]) of the bytes or values (absolute offsets)
        self._starts = np.frombuffer(array.buffers()[1], width, count=len(array) + 1,
                                     offset=array.offset * width.itemsize)
        self.ragged, self.nbytes = ragged, array.nbytes
        if ragged:  # (``values``: the list's values decoded, ``decode``'s ``_inner``)
            self._values = numpy_of(array.values) if values is None else values
            self._values.flags.writeable = False
        else:
            data = array.buffers()[2]
            raw: np.ndarray = np.frombuffer(data, np.uint8) if data is not None else _NO_BYTES
            self._byte_starts = self._starts  # (``_starts`` may count characters: _as_text)
            self._text = pa.types.is_string(kind) or pa.types.is_large_string(kind)
            # ASCII text and bytes stay Arrow's (a view): a decode and two copies a row group
            # less where batches are gathered from a join. Other text is decoded now.
            self._data: np.ndarray | bytes | str = raw
            if self._text and len(raw) and int(raw.max()) >= 0x80:
                self._data = raw.tobytes()
                self._as_text()

    def _as_text(self) -> None:
        """The row group's bytes decoded once into one ``str``, whose slices are the rows: a
        slice of a ``str`` is made faster than a ``str`` from a slice of bytes. Outside ASCII
        the offsets are counted again in characters (each byte that starts one)."""
        raw = self._data
        assert isinstance(raw, bytes)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return  # rows decoded one by one, as read (an invalid row raises there)
        if len(text) != len(raw):
            starts_char = (np.frombuffer(raw, np.uint8) & 0xC0) != 0x80
            chars = np.concatenate([[0], np.cumsum(starts_char)])
            self._starts = chars[self._starts]
        self.nbytes += sys.getsizeof(text) - len(raw)
        self._data = text

    @property
    def text(self) -> bool:
        """Rows of text (``str``), else of bytes (or ragged lists)."""
        return not self.ragged and self._text

    def _sliceable(self) -> Any:
        """What rows are sliced from: the values, or the bytes as one ``bytes`` or ``str``
        (made from Arrow's view the first time, which is then let go)."""
        if self.ragged:
            return self._values
        if type(self._data) is np.ndarray:  # ASCII text or bytes: the same size either way
            raw = self._data.tobytes()
            self._data = raw.decode("ascii") if self._text else raw
        return self._data

    def buffer_part(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The rows' bytes and their offsets as Arrow keeps them, for ``string_column.rows_of``
        (batches gathered by NumPy calls); ``None`` for ragged lists and for text that is not
        UTF-8 (read row by row, where a bad row raises)."""
        if self.ragged or (self._text and type(self._data) is bytes):  # (not UTF-8)
            return None
        data = self._data
        if isinstance(data, np.ndarray):
            return data, self._byte_starts
        return np.frombuffer(data.encode() if isinstance(data, str) else data,
                             np.uint8), self._byte_starts

    def __getitem__(self, row: int) -> Any:
        return self.take(np.array([row]))[0]

    def take(self, rows: np.ndarray, axis: int = 0) -> list:
        """The rows ``rows`` as a list of ``str``, ``bytes`` or read-only arrays (``axis`` as
        for a NumPy column: rows only)."""
        return self.take_span(rows, 0, len(rows))

    def take_span(self, rows: np.ndarray, a: int, b: int, plus: np.ndarray | None = None,
                  listed: list | None = None) -> list:
        """``take(rows[a:b])``; ``plus`` (``rows + 1``) and ``listed`` (``rows.tolist()``),
        when given, are computed once for the spans of a batch instead of once a span."""
        starts = self._starts
        data = self._sliceable()
        if b - a <= _FEW_ROWS:  # a full shuffle's runs: NumPy calls cost more than the rows
            at = starts.item  # Python ints: slicing by NumPy scalars is slower (0.76 against
            some = (rows.tolist() if listed is None else listed)[a:b]  # 1.12 us, 3 rows)
            out = [data[at(r):at(r + 1)] for r in some]
        else:
            after = rows + 1 if plus is None else plus
            out = [data[x:y] for x, y in zip(starts[rows[a:b]].tolist(),
                                             starts[after[a:b]].tolist())]
        if not self.ragged and self._text and isinstance(data, bytes):
            # text that is not UTF-8 as a whole: row by row (an invalid row raises)
            try:
                return [str(row, "utf-8") for row in cast("list[bytes]", out)]
            except UnicodeDecodeError as e:
                raise ConfigError(
                    f"ParquetSource: {self.where} holds a string that is not UTF-8 ({e}: "
                    f"{e.object[:40]!r}); Parquet strings are UTF-8: fix its writer, or read "
                    "the column as binary (cast it to bytes when writing the file), or leave "
                    "it out with columns=") from None
        return out


class ArrowStruct:
    """A struct column as the cache keeps it: its fields decoded as columns are (arrays,
    ``ArrowRows``, structs); a row is a dict of its fields, a batch's run a dict of theirs.

    Example:
        >>> import pyarrow as pa
        >>> point = decode(pa.chunked_array([[{"x": 1.5, "tag": "a"}, {"x": 2.5, "tag": "b"}]]),
        ...                "point", "f.parquet")
        >>> point[1]
        {'x': np.float64(2.5), 'tag': 'b'}
    """

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields
        self.nbytes = sum(nbytes_of(c) for c in fields.values())

    def __getitem__(self, row: int) -> dict[str, Any]:
        return {name: field[row] for name, field in self.fields.items()}

    def take_span(self, rows: np.ndarray, a: int, b: int, plus: np.ndarray | None = None,
                  listed: list | None = None) -> dict[str, Any]:
        """Each field's ``rows[a:b]`` (as ``ArrowRows.take_span``)."""
        out: dict[str, Any] = {}
        for name, field in self.fields.items():
            if type(field) is np.ndarray:
                out[name] = field.take(rows[a:b], axis=0)
            else:
                out[name] = field.take_span(rows, a, b, plus, listed)
        return out


def join(parts: list) -> Any:
    """One column of a batch from its runs: arrays concatenated; lists of objects into an
    object array (ragged rows one by one: NumPy must not stack rows of equal length); a
    struct's runs (dicts) field by field, into a dict."""
    if isinstance(parts[0], dict):
        return {name: join([p[name] for p in parts]) for name in parts[0]}
    if not any(isinstance(p, list) for p in parts):
        if len(parts) == 1:
            return parts[0]
        try:
            return np.concatenate(parts)
        except ValueError:  # lists of one length in a row group, another in the next
            pass
    # a list column ragged in one row group and of one length in another, or of one length
    # in each but not the same: rows of both
    values = parts[0] if len(parts) == 1 else list(itertools.chain.from_iterable(parts))
    return object_column(values)


def runs_order(groups: np.ndarray) -> np.ndarray:
    """The order that puts a batch's rows (of row groups ``groups``) in runs of one row group
    each, the runs in the order the batch first reads their groups: a read-local batch across
    two windows reads the one before's groups first, which the cache still holds; taken by
    group number, the next window's decoded first evicted them, decoded again for the next
    batch (~1.7x the decodes of an epoch).

    Example:
        >>> runs_order(np.array([7, 2, 7, 5, 2])).tolist()
        [0, 2, 1, 4, 3]
    """
    _, first, which = np.unique(groups, return_index=True, return_inverse=True)
    return np.argsort(first).argsort()[which.reshape(-1)].argsort(kind="stable")


def pick(batch: dict[str, Any], at: Any) -> dict[str, Any]:
    """Every column's (and struct field's) ``column[at]``: a batch's rows reordered, with no
    pytree walk (``tree.flatten``) a batch."""
    return {name: pick(c, at) if isinstance(c, dict) else c[at] for name, c in batch.items()}


def leaves(batch: dict[str, Any]) -> Iterator[np.ndarray]:
    """The batch's columns, structs' fields in their place."""
    for column in batch.values():
        if isinstance(column, dict):
            yield from leaves(column)
        else:
            yield column


def nbytes_of(column: Any) -> int:
    return int(column.nbytes)
