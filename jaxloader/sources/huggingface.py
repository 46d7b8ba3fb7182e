"""Hugging Face ``datasets.Dataset``, passed to the loader as it is, read as NumPy.

In its default (Python) format a ``Dataset`` returns list features as Python lists, which are
pytree nodes: a 32-float feature would batch as 32 arrays of shape ``(batch,)``. The loader
therefore reads a ``Dataset`` through ``HuggingFaceSource``: the same columns in NumPy format
(without its float32 and int64 defaults), so a numeric list feature is one array (``(batch,
32)``); columns of strings or bytes from Arrow, so they stay ``str`` and ``bytes`` (object
leaves, whole, whatever their lengths) in either format. A dataset with its own transform
(``with_transform``) is read through it, its columns batched. Batches are read with one
vectorised call, and the dataset's own fingerprint (it changes with every ``map``/``filter``)
guards restores.
``datasets`` is not a dependency: a ``Dataset`` is recognised by its module.

Example (``tests/sources/test_huggingface.py`` runs it)::

    ds = datasets.Dataset.from_dict({"v": [[0.0, 1.0]] * 4, "t": ["a", "bb", "c", "d"]})
    batch = next(iter(jl.DataLoader(ds, batch_size=2)))
    batch["v"].shape, batch["t"].tolist()   # ((2, 2), ['a', 'bb'])
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from jaxloader.base.checks import record_index, released_at_least
from jaxloader.base.columns import object_column
from jaxloader.base.errors import ConfigError, RecordError
from jaxloader.base.mapped_files import MappedFiles
from jaxloader.sources.arrow_numpy import is_list, numpy_of, zone_in
from jaxloader.sources.huggingface_rows import failing_row, has_media, has_nulls, null_rows
from jaxloader.sources.protocol import Source


_NUMPY_2 = (2, 21, 0)  # the first datasets release whose NumPy format works under NumPy 2
_LENGTH_BATCH = 1 << 16  # rows a slice of the Arrow table while reading lengths


def adapt(source: Any) -> Any:
    """``HuggingFaceSource(source)`` for a ``datasets.Dataset``, the source itself otherwise;
    a ``Dataset``'s column (``ds["x"]``, a sequence of Python rows) refused."""
    if type(source).__module__.startswith("datasets.") and hasattr(source, "with_format") \
            and not isinstance(source, dict):  # (a DatasetDict: refused by check_source)
        return HuggingFaceSource(source)
    if type(source).__module__.startswith("datasets.") and hasattr(source, "column_name"):
        name = source.column_name
        raise ConfigError(
            f"a datasets Column (ds[{name!r}]): its rows are Python values, and a list feature "
            "would batch as one array of shape (batch,) an item, slowly; pass the dataset, or "
            f"ds.select_columns([{name!r}]), read as NumPy: batch[{name!r}] is one array of "
            "shape (batch, ...)")
    return source


def refuse_zones(what: str, schema: Any, read: Any = None) -> None:
    """Refuses a column of ``schema`` (of ``read``'s names, or any) that holds times in a zone
    other than UTC's, at any depth: NumPy's datetime64 has no zone, and each value would come
    out as its instant in UTC, its hours UTC's (``what``: the dataset, as errors name it)."""
    for name in schema.names if read is None else read:
        kind = schema.field(name).type
        zone = zone_in(kind)
        if zone is not None:
            cast = (f"ds.cast_column({name!r}, Value('timestamp[us, tz=UTC]'))"
                    if str(kind).startswith("timestamp") else f"ds.cast_column({name!r}, "
                    f"its features with Value('timestamp[us, tz=UTC]') for the times in {kind})")
            raise ConfigError(
                f"{what}: column {name!r} holds times in the zone {zone!r}, which NumPy's "
                "datetime64 has not: its values would come out as the instants in UTC, their "
                f"hours UTC's, without a word; cast them to UTC ({cast}) or leave it out "
                "(ds.remove_columns)")


class HuggingFaceSource(Source):
    """A ``datasets.Dataset`` (any format) read in NumPy format, strings as ``str`` (read from
    Arrow), structs (dict features) as dicts of their fields batched, numbers of the dtypes
    the features declare (NumPy format gives a struct's fields as ``float64``/``int64``)."""

    def __init__(self, dataset: Any) -> None:
        fmt = dataset.format
        # the user's own transform (with_transform / set_transform): kept, its answers batched;
        # its record 0 read twice at the first state (an augmentation there: warned of)
        self.custom = self.reads_run_code = fmt["type"] == "custom"
        if (fmt.get("format_kwargs") or {}).get("dtype") is not None:  # (the columns' own)
            raise ConfigError(
                f"a datasets.Dataset with_format({fmt['type']!r}, dtype="
                f"{fmt['format_kwargs']['dtype']!r}): the loader reads the columns' own dtypes "
                "(float64 stays float64), not the format's dtype=, which it would leave out "
                "without a word; cast in a Map (jl.Map(lambda r: {**r, 'x': r['x'].astype("
                "np.float16)})), or in the dataset (ds.cast_column)")
        release = str(getattr(sys.modules.get("datasets"), "__version__", ""))
        if not self.custom and not released_at_least(release, _NUMPY_2):
            raise ConfigError(  # (its NumPy format's np.array(copy=False): a bare ValueError)
                f"a datasets.Dataset: datasets {release} reads no batch under NumPy "
                f"{np.__version__} (its NumPy format was made for NumPy 1; 2.21 was the first "
                "release for NumPy 2); pip install \"datasets>=2.21\" (the test extra's "
                "floor is 4.8.5)")
        self.fingerprint = str(getattr(dataset, "_fingerprint", "")) or None
        self._mapped = MappedFiles("a datasets.Dataset", paths=[  # (Arrow maps them: a file
            f["filename"] for f in getattr(dataset, "cache_files", None) or ()],  # cut, read,
            remedy="save it to another folder (ds.save_to_disk(new)), or load it again after "
                   "it is written (datasets.load_from_disk)",  # is a SIGBUS, no word)
            addresses=[b.address for column in dataset.data.table.columns[:1]
                       for chunk in column.chunks for b in chunk.buffers() if b is not None]
            if getattr(dataset, "cache_files", None) else ())  # (mapped ones' alone)
        self._features = {} if self.custom else dict(getattr(dataset, "features", None) or {})
        read = (dataset.column_names if fmt["columns"] is None or fmt["output_all_columns"]
                else fmt["columns"])
        media = {key for key in read if has_media(self._features.get(key))}
        if not self.custom:
            refuse_zones("a datasets.Dataset", dataset.data.schema, read)
        # Columns of strings or bytes are read from Arrow: NumPy format makes such a column
        # a fixed-width array first, which cut a value's trailing NULs and took the longest
        # value's width for every row (a 2 MB document in a batch of 128: 1 GiB); and times
        # of day (NumPy format: datetime.time objects, which no batch holds). The others
        # in NumPy format without its default dtypes (float32 for every float: float64 values
        # were rounded; int64 for durations). Images and sounds: decoded by NumPy format.
        # Both from one Arrow read (rows taken through a shuffle's indices once).
        self._text = [] if self.custom else [
            key for key in read if key not in media and _read_from_arrow(
                dataset.data.schema.field(key).type)]
        self._read, self._numeric = read, [key for key in read if key not in self._text]
        # lists of other lengths: an object array in every batch, also where a batch's rows
        # happen to be of one length (NumPy format stacks those: a leaf on the device then)
        self._ragged = set() if self.custom else {
            key for key in self._numeric if _ragged(dataset, key)}
        self.dataset = dataset if self.custom else dataset.with_format("arrow", columns=read)
        self._numpy: Any = None if self.custom else _numpy_formatter(dataset.features)
        # the rows where a column read holds a null (found once; none read where Arrow's
        # counts say there are none), checked against each read's indices: NumPy format gives
        # a null as NaN, an int column with one as floats (cast back here: the null another
        # number), a string, a struct's field or an image as None. An image's or a sound's
        # own fields (``_media``, at any depth) are left alone: a null path beside its bytes
        # is how they are stored.
        self._nulls = {} if self.custom else {
            key: rows for key in read if has_nulls(dataset.data.column(key), key in media)
            and len(rows := null_rows(dataset, key, key in media))}

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        index = record_index(index, len(self.dataset), "HuggingFaceSource")
        self._mapped.soon()  # (a record's read: its files at most every 10 ms; a batch's each)
        row = self.dataset[index]
        if self._nulls:
            self._check_nulls(np.array([index]))
        if self.custom:
            return row
        out = self._numpy.format_row(row.select(self._numeric)) if self._numeric else {}
        out.update({key: _first(_from_arrow(row.column(key))) for key in self._text})
        return {key: _as_declared(out[key], self._features.get(key)) for key in self._read}

    def __getitems__(self, indices: np.ndarray) -> Any:
        try:
            return self._getitems(indices)
        except RecordError:
            raise
        except Exception as e:  # (a row that does not read: named, with its column)
            raise failing_row(self, indices, e) from e

    def _getitems(self, indices: np.ndarray) -> Any:
        self._mapped.check()
        rows = self.dataset[np.asarray(indices).tolist()]
        if self._nulls:
            self._check_nulls(np.asarray(indices))
        if self.custom:  # the transform's columns: lists of rows, or arrays
            return {key: _strings_as_objects(_rows_batched(value, repr(key)))
                    for key, value in rows.items()}
        batch = {key: object_column([np.asarray(v) for v in value]) if key in self._ragged
                 else _rows_batched(value) for key, value in self._numpy.format_batch(
            rows.select(self._numeric)).items()} if self._numeric else {}
        batch.update({key: _from_arrow(rows.column(key)) for key in self._text})
        return {key: _as_declared(batch[key], self._features.get(key)) for key in self._read}

    def lengths(self, key: str) -> np.ndarray | None:
        """Every row's length of the list column ``key``, from the Arrow lists' offsets (no
        token converted): what ``PackedSource`` needs, in order after any ``shuffle``,
        ``select`` or ``filter``. ``None`` when ``key`` is not a column of lists of integers,
        or the dataset has its own transform: ``PackedSource`` then reads the records.

        Example (``tests/sources/test_huggingface.py`` runs it)::

            ds = datasets.Dataset.from_dict({"ids": [[5, 8, 13], [1]]})
            HuggingFaceSource(ds).lengths("ids").tolist()   # [3, 1]
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        if self.custom or key not in self.dataset.column_names:
            return None
        kind = self.dataset.data.schema.field(key).type
        if not is_list(kind) or not pa.types.is_integer(kind.value_type):
            return None
        column = self.dataset.with_format("arrow", columns=[key])
        out = [pc.list_value_length(table[key]).to_numpy(zero_copy_only=False)
               for table in column.iter(batch_size=_LENGTH_BATCH)]
        lengths = np.concatenate(out) if out else np.zeros(0, np.int64)
        if lengths.dtype.kind == "f":  # (a null list's length is null: NaN here)
            rows = np.flatnonzero(np.isnan(lengths))  # (as ParquetSource.lengths: a null is
            raise ValueError(  # not an empty list)
                f"HuggingFaceSource: column {key!r} has {len(rows)} null list(s), in rows "
                f"{rows[:5].tolist()} (the dataset's indices); fill them (ds.map) or drop those "
                "rows (ds.filter)")
        return lengths.astype(np.int64)

    def _check_nulls(self, indices: np.ndarray) -> None:
        """Refuses the rows ``indices`` where a numeric column holds a null, naming it."""
        for key, held in self._nulls.items():
            at = np.minimum(np.searchsorted(held, indices), len(held) - 1)
            hit = indices[held[at] == indices]
            if len(hit):
                kind = self.dataset.data.schema.field(key).type
                got = ("NaN, or for integers a float cast back (another number)"
                       if _numeric(kind) else "None where the other rows hold values")
                raise RecordError(
                    f"Hugging Face dataset: column {key!r} ({kind}) holds a null in rows "
                    f"{hit[:5].tolist()} (the dataset's indices), expected values: NumPy "
                    f"format would give {got}; fill the nulls (ds.map), drop those rows "
                    "(ds.filter) or the column (ds.remove_columns)")

    def __repr__(self) -> str:
        return f"HuggingFaceSource({self.dataset!r:.200})"


def _numeric(kind: Any) -> bool:
    """Whether an Arrow type holds numbers (or booleans), at any depth of lists."""
    import pyarrow as pa

    while is_list(kind):
        kind = kind.value_type
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)


def _ragged(dataset: Any, key: str) -> bool:
    """Whether the dataset's rows (after its ``select``/``filter``/``shuffle``) of column
    ``key`` are lists of more than one length (from Arrow's offsets: ~0.1 s for 10M rows)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column, rows = dataset.data.column(key), getattr(dataset, "_indices", None)  # (kept)
    if isinstance(column.type, pa.ExtensionType):  # (Array2D/3D((None, n)): lists of lists)
        column = pa.chunked_array([c.storage for c in column.chunks], column.type.storage_type)

    def listed(kind: Any) -> bool:
        return pa.types.is_list(kind) or pa.types.is_large_list(kind) or \
            pa.types.is_fixed_size_list(kind)
    if rows is not None and listed(column.type) and listed(column.type.value_type):
        column, rows = pc.take(column, rows.column(0)), None  # (lists in lists: rows kept's)
    while listed(column.type):
        lengths = pc.list_value_length(column)
        extremes = pc.min_max(lengths if rows is None else pc.take(lengths, rows.column(0)))
        if extremes["min"].as_py() != extremes["max"].as_py():
            return True
        column, rows = pc.list_flatten(column), None
    return False


def _rows_batched(column: Any, key: str = "") -> Any:
    """A column of rows as one array: rows of one shape (arrays, NumPy or Python numbers,
    tensors) stacked, strings an object array, dicts (a struct feature, which NumPy format
    gives as an object array of them) a dict of their fields batched, others an object array.
    Arrays (NumPy format's columns) are kept as they are."""
    if isinstance(column, np.ndarray) and column.dtype == object and len(column) and (
            isinstance(column[0], dict)):
        column = list(column)
    if not isinstance(column, (list, tuple)) or not column:
        return column
    if isinstance(column[0], dict):
        return {k: _rows_batched([row[k] for row in column], f"{key}[{k!r}]")
                for k in column[0]}
    if any(v is None for v in column) or all(isinstance(v, str) for v in column) or all(
            isinstance(v, bytes) for v in column):
        return object_column(list(column))  # (a null: None, as the dataset gives it)
    try:
        rows = [np.asarray(v) for v in column]
    except (TypeError, ValueError):  # (a ragged nested list)
        return object_column(list(column))
    return _stacked(rows, key)


def _stacked(values: list, key: str = "") -> Any:
    """Rows of one shape and dtype stacked, others an object column; rows of one shape and
    other dtypes (a transform's ints beside floats, ids past 2**63 beside ints: NumPy made
    them float64, rounded) or of str beside bytes refused, naming the column (``key``)."""
    kinds = {v.dtype if v.dtype.kind in "biufcmMV" else v.dtype.kind for v in values}
    if len(kinds) > 1 and len({v.shape for v in values}) == 1 and kinds <= {
            *(k for k in kinds if isinstance(k, np.dtype)), "U", "S"}:
        raise RecordError(
            f"a datasets.Dataset's transform gave column {key or '?'} rows of other kinds "
            f"({sorted(map(str, kinds))}), which one batch cannot hold as they are (NumPy "
            "would make them one type, changing their values); make them one dtype in the "
            "transform (np.asarray(value, np.float32) for each row)")
    if all(isinstance(v, np.ndarray) and v.dtype.kind in "biufcmMV" for v in values) and len(
            {v.shape for v in values}) == 1:
        return np.stack(values)
    return object_column(values)


def _as_declared(value: Any, feature: Any) -> Any:
    """``value`` with strings as ``str`` and numbers cast to the dtype ``feature`` declares
    (through lists, and a struct's fields)."""
    if isinstance(value, dict):
        fields = feature if isinstance(feature, dict) else {}
        return {key: _as_declared(v, fields.get(key)) for key, v in value.items()}
    value = _strings_as_objects(value)
    dtype = _declared_dtype(feature)
    if dtype is None or not isinstance(value, np.ndarray):
        return value
    if value.dtype.kind in "biuf" and value.dtype != dtype:
        return value.astype(dtype)
    if value.dtype == object and value.ndim == 1:  # ragged rows, one array each
        return object_column([v.astype(dtype) if isinstance(v, np.ndarray)
                              and v.dtype.kind in "biuf" and v.dtype != dtype else v
                              for v in value])
    return value


def _declared_dtype(feature: Any) -> np.dtype | None:
    """The numeric dtype of a ``Value`` feature, or of the values of a list of them."""
    while feature is not None and not hasattr(feature, "dtype") and hasattr(feature, "feature"):
        feature = feature.feature  # Sequence / List / LargeList
    try:
        dtype = np.dtype(getattr(feature, "dtype", None) or "O")
    except (TypeError, ValueError):  # "decimal128(2, 1)": NumPy's ValueError
        return None  # "string", "large_string", "binary", ...
    return dtype if dtype.kind in "biuf" else None


def _numpy_formatter(features: Any) -> Any:
    """NumPy format's formatter (it decodes images and sounds) without its default dtypes."""
    from datasets.formatting import get_formatter

    return get_formatter("numpy", features=features, dtype=None)


def _read_from_arrow(kind: Any, top: bool = True) -> bool:
    """Whether a column of this Arrow type is read by ``_from_arrow``: strings and bytes (NumPy
    format makes a column of them one fixed-width array; in lists and structs it keeps them
    as objects), and times of day at any depth of lists and structs of numbers (NumPy format:
    ``datetime.time`` objects, which no batch holds)."""
    import pyarrow as pa

    if pa.types.is_struct(kind):
        fields = [kind.field(i).type for i in range(kind.num_fields)]
        return not any(map(_text, fields)) and any(_read_from_arrow(f, False) for f in fields)
    if is_list(kind):
        return not _text(kind.value_type) and _read_from_arrow(kind.value_type, False)
    return top and _text(kind) or pa.types.is_time(kind)


def _text(kind: Any) -> bool:
    """Whether an Arrow type is strings or bytes (views too), or holds them, at any depth."""
    import pyarrow as pa

    if pa.types.is_struct(kind):
        return any(_text(kind.field(i).type) for i in range(kind.num_fields))
    if is_list(kind):
        return _text(kind.value_type)
    views = [getattr(pa.types, f"is_{name}_view", None) for name in ("string", "binary")]
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(
        kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind) or any(
        view(kind) for view in views if view is not None)


def _from_arrow(column: Any) -> Any:
    """A batch's Arrow column of ``_read_from_arrow``'s types: strings and bytes an object
    array of ``str``/``bytes``, whole; times of day ``timedelta64`` since midnight (as
    ``ParquetSource`` gives them), in a struct's fields (a dict of them) and in lists (an array
    a row, stacked where the rows are of one shape)."""
    import pyarrow as pa

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = array.type
    if pa.types.is_struct(kind):
        return {kind.field(i).name: _from_arrow(field) for i, field in enumerate(
            array.flatten())}
    if is_list(kind):
        if pa.types.is_fixed_size_list(kind):
            return _stacked([_from_arrow(row.values) for row in array])
        offsets = array.offsets.to_pylist()
        return _stacked([_from_arrow(array.values.slice(a, b - a)) for a, b in zip(
            offsets[:-1], offsets[1:])])
    return numpy_of(array) if pa.types.is_time(kind) else object_column(array.to_pylist())


def _first(value: Any) -> Any:
    """The first row of a batch from ``_from_arrow`` (a dict's fields' first rows)."""
    return {k: _first(v) for k, v in value.items()} if isinstance(value, dict) else value[0]


def _strings_as_objects(column: Any) -> Any:
    """NumPy's fixed-width strings (padded to the longest) as an object array of ``str``."""
    if isinstance(column, np.ndarray) and column.dtype.kind in "US":
        out = np.empty(column.shape, dtype=object)
        out[...] = column.tolist()
        return out
    return column
