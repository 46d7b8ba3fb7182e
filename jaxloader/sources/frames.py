"""A pandas or polars ``DataFrame`` (or ``Series``), or a pyarrow ``Table`` (or array), as
``ArraySource`` takes it: a dict of its columns as NumPy arrays, each of its own dtype, a column
NumPy would hold otherwise than as its values (nulls, objects, a time zone) refused, named, with
what to do; and pandas leaves paired by position refused where their indexes differ.

Example:
    >>> import pandas as pd
    >>> {k: v.dtype.name for k, v in frame_columns(pd.DataFrame({"a": [1], "b": [.5]})).items()}
    {'a': 'int64', 'b': 'float64'}
"""

from __future__ import annotations

import contextvars
import sys
from typing import Any

import numpy as np

from jaxloader.base.errors import ConfigError
from jaxloader.sources.arrow_numpy import numpy_of


# What NumPy makes of a frame of several dtypes (``np.asarray``), as refusals say it.
FRAME_AS_ONE = ("which NumPy would make one array of one dtype (its column names lost, int64 ids "
                "past 2**53 rounded in float64, a null NaN)")


def is_data_frame(x: Any) -> bool:
    """Whether ``x`` is a pandas or polars ``DataFrame`` or ``Series`` (neither imported)."""
    kind = type(x)
    return kind.__module__.split(".")[0] in ("pandas", "polars") and kind.__name__ in (
        "DataFrame", "Series")


def as_series(x: Any) -> Any:
    """A pandas ``Index`` or array (``pd.array(.., "Int64")``, a ``Categorical``) as a
    ``Series``, whose checks it then gets (``np.asarray``: NaN of a missing value, in
    silence); anything else as it is."""
    pd = sys.modules.get("pandas")
    if pd is not None and isinstance(x, (pd.api.extensions.ExtensionArray, pd.Index)) and \
            not isinstance(x, pd.MultiIndex):  # (no Series holds one: refused as it was)
        return pd.Series(x, copy=False)
    return x


def one_kind_of_numbers(frame: Any) -> bool:
    """Whether every column of a pandas or polars ``DataFrame`` is of one NumPy dtype of
    numbers (no nullable or other kind): its ``to_numpy()`` is exact."""
    kinds = list(frame.dtypes)
    if type(frame).__module__.startswith("polars"):
        numeric = all(kind.is_numeric() and kind == kinds[0] for kind in kinds) and not any(
            column.null_count() for column in frame.get_columns())
        return bool(kinds) and numeric and type(kinds[0]).__name__ not in (
            "Decimal", "Int128", "UInt128")  # (no NumPy form)
    return bool(kinds) and all(isinstance(kind, np.dtype) and kind == kinds[0]
                               and kind.kind in "biufc" for kind in kinds)


def frame_columns(frame: Any, subject: str = "") -> Any:
    """A ``DataFrame``'s columns as a dict of arrays by position (a ``Series``: its values);
    a column NumPy cannot hold as numbers is refused, named, with what to do (a ``Series``
    by ``subject`` where given). A polars frame's too (np.asarray of one made a float64
    matrix: its ids rounded, its names lost)."""
    if subject:
        token = SUBJECT.set(subject)
        try:
            return frame_columns(frame)
        finally:
            SUBJECT.reset(token)
    if type(frame).__module__.startswith("polars"):
        return _polars_column(None, frame) if type(frame).__name__ == "Series" else {
            name: _polars_column(name, frame.get_column(name)) for name in frame.columns}
    if type(frame).__name__ == "Series":
        return _column(None, frame)
    names = [str(name) for name in frame.columns]
    if len(set(names)) != len(names):
        raise ConfigError(f"ArraySource(DataFrame): column names must differ, got {names}; "
                          "rename the repeated ones (df.columns = [...])")
    return {name: _column(name, column) for name, (_, column) in zip(names, frame.items())}


def _polars_column(name: str | None, column: Any) -> np.ndarray:
    """A polars column as NumPy (its dtype's: Int64 as int64, Datetime as datetime64, Boolean
    as bool); one with nulls refused (NumPy would hold them as NaN, integers as floats), a
    Struct (NumPy made one float64 matrix of its fields: names lost, ids rounded) too."""
    text = str(column.dtype) in ("String", "Utf8")
    if column.null_count():
        value = "''" if text else "0"
        fill = (f"fill_null({value})" if name is None else
                f"with_columns(pl.col({name!r}).fill_null({value}))")
        raise ConfigError(
            f"{_named(name)} ({column.dtype}) has {column.null_count()} null(s), expected "
            f"{'strings' if text else 'numbers'} (NumPy would hold them as "
            f"{'None' if text else 'NaN, and integers as floats'}); fill them "
            f"(df.{fill}) or drop those rows (df.drop_nulls())")
    if getattr(column.dtype, "time_zone", None) is not None:  # (to_numpy: UTC's, unsaid)
        col = "s" if name is None else f"df.with_columns(pl.col({name!r})"
        raise _zoned(f"{_named(name)} is {column.dtype}", f"{col}.dt.convert_time_zone('UTC')"
                     f".dt.replace_time_zone(None){')' if name else ''}")
    if type(column.dtype).__name__ == "Struct":
        raise ConfigError(
            f"{_named(name)} is a {column.dtype}, which NumPy would make one float64 matrix of "
            "its fields (their names lost, int64 ids past 2**53 rounded); give its fields "
            f"columns of their own: df.unnest({name or 'column'!r})")
    try:
        array = np.asarray(column.to_numpy())
    except Exception as error:  # noqa: BLE001 - polars' own (Int128: no NumPy dtype)
        raise ConfigError(f"{_named(name)} ({column.dtype}) has no NumPy form ({error}); cast "
                          "it to a NumPy dtype (df.cast) or leave it out") from None
    if array.dtype.hasobject and text:
        lengths = column.str.len_chars()
        _check_width(_named(name), len(array), int(lengths.sum()), int(lengths.max() or 0),
                     "df.to_dicts() (records with str leaves), datasets.Dataset.from_polars(df)")
        _check_no_trailing_nul(_named(name), bool(column.str.ends_with("\x00").any()),
                               "df.to_dicts() (records with str leaves)")
        return np.asarray(array, dtype=str)  # (fixed width, as np.asarray(series) gave it)
    if array.dtype.hasobject and name is not None:
        raise ConfigError(f"{_named(name)} has dtype {column.dtype}, which NumPy holds as "
                          "Python objects (strings, categories, lists, decimals), expected "
                          f"numbers; {_polars_remedy(name, type(column.dtype).__name__)}")
    return array


_WIDE = 64 * 2**20  # fixed-width strings up to this many bytes are taken, however wide


def _check_no_trailing_nul(named: str, found: bool, records: str) -> None:
    """Refuses strings that end with a NUL, which NumPy's fixed width cuts off (its padding):
    ``'ab\\x00'`` read ``'ab'``; ``records``: the call that gives records of str leaves."""
    if found:
        raise ConfigError(
            f"{named} holds strings ending with a NUL character ('\\x00'), which NumPy's "
            f"fixed-width strings drop (their padding), so they would read shorter; pass "
            f"{records}, whose str leaves keep them, or strip them first")


def _check_width(named: str, n: int, chars: int, longest: int, records: str) -> None:
    """Refuses ``n`` strings NumPy's fixed width would make much larger than their ``chars``
    (one long document among short ones made every string its width), asked before it is
    made; ``records``: the call that gives records of str leaves instead."""
    wide = 4 * longest * n  # (UTF-32, each as wide as the longest)
    if wide > max(_WIDE, 8 * 4 * chars):
        raise ConfigError(
            f"{named} holds {n} strings of {chars} characters in all, which NumPy's fixed "
            f"width (each as long as the longest, {longest}) would make {wide / 2**20:.0f} "
            f"MiB; pass {records}, or tokenize the text first")


def _zoned(subject: str, drop: str) -> ConfigError:
    """The refusal of times with a zone (``subject``: the column and its type), which NumPy's
    datetime64 has not; ``drop``: the call that gives its instants in UTC without it."""
    return ConfigError(f"{subject}, whose zone NumPy's datetime64 has not (hours of the day "
                       f"would be UTC's); drop the zone ({drop}: the instants in UTC), or "
                       "convert to local times first")


def _column(name: str | None, column: Any) -> np.ndarray:  # (name: None, a Series)
    """A pandas column as NumPy: a nullable dtype's of numbers (``Int64``, ``Float64``,
    ``boolean``, pyarrow's) as its NumPy dtype where it has no missing value, refused where it
    has one (``to_numpy`` gave NaN, and integers as floats: 2**53 + 1 rounded)."""
    if getattr(getattr(column.dtype, "pyarrow_dtype", column.dtype), "tz", None) is not None:
        raise _zoned(  # (pyarrow's: to_numpy gave UTC's datetime64 without a word; pandas':
            # objects, which a Series or an Index leaf was refused as with no word of its zone)
            f"{_named(name)} has dtype {column.dtype}",
            f"df[{name!r}].dt.tz_convert(None)" if name is not None else
            "s.dt.tz_convert(None); an Index's: idx.tz_convert(None)")
    dtype = getattr(column.dtype, "numpy_dtype", None)
    numbers = isinstance(dtype, np.dtype) and not dtype.hasobject
    coded = type(column.dtype).__name__ == "CategoricalDtype"  # (to_numpy: floats, NaN)
    if (numbers or coded) and not isinstance(column.dtype, np.dtype) and (
            missing := np.flatnonzero(np.asarray(column.isna()))).size:
        remedy = (f"fill them (df[{name!r}].fillna(0)) or drop those rows (df.dropna(subset="
                  f"[{name!r}]))" if name is not None else
                  "fill them (s.fillna(0)) or drop those rows (s.dropna())")
        if coded:  # (a fill of -1 among strings: refused next as objects)
            col = "s" if name is None else f"df[{name!r}]"
            fill = ("" if column.cat.categories.dtype.kind not in "biuf" else
                    f"fill them ({col}.cat.add_categories(-1).fillna(-1)), ")
            remedy = (f"{fill}take its codes ({col}.cat.codes: -1 where missing), or "
                      "drop those rows")
        raise ConfigError(
            f"{_named(name)} ({column.dtype}) has {missing.size} missing value(s), in rows "
            f"{missing[:5].tolist()} (by position), expected numbers (NumPy would hold them as "
            f"NaN, and integers as floats); {remedy}")
    array = column.to_numpy(dtype=dtype) if numbers else column.to_numpy()
    if array.dtype.hasobject and name is not None:  # (a Series': as any leaf of objects)
        raise ConfigError(
            f"{_named(name)} has dtype {column.dtype}, which NumPy "
            "holds as Python objects (strings, categories, dates with a time zone, arrays), "
            f"expected numbers; {_pandas_remedy(name, column, array)}")
    return array


def _polars_remedy(name: str, kind: str) -> str:
    """What to do with a polars column of ``kind`` NumPy holds as objects."""
    col = f"df[{name!r}]"
    return {"Decimal": f"cast it ({col}.cast(pl.Float64); pl.Int64 or pl.UInt64 for whole "
                       "ids, which floats round)",
            "Categorical": f"take its codes ({col}.to_physical())",
            "Enum": f"take its codes ({col}.to_physical())",
            "Time": f"make it numbers ({col}.cast(pl.Int64): nanoseconds since midnight)",
            "List": f"pass df.to_dicts(), records the loader reads as they are (jl.Pad pads "
                    f"lists of other lengths), or, all of one length n, {col}.list.to_array(n)"
            }.get(kind, "pass df.to_dicts(), whose records keep str, bytes and other leaves")


def _pandas_remedy(name: str, column: Any, array: np.ndarray) -> str:
    """What to do with a pandas column NumPy holds as objects."""
    col, kind = f"df[{name!r}]", type(column.dtype).__name__
    first = next((v for v in array if v is not None and not (isinstance(v, float) and v != v)),
                 None)  # (not None, nor NaN)
    if isinstance(first, (np.ndarray, list, tuple)):
        return ("it holds an array a row (a molecule's atoms): pass df.to_dict('records'), a "
                "list of records the loader reads as they are (jl.Pad pads rows of other "
                "lengths)")
    if kind == "CategoricalDtype":
        return f"take its codes ({col}.cat.codes)"
    if kind == "PeriodDtype":
        return f"make it times ({col}.dt.to_timestamp(): datetime64) or numbers ({col}.dt.year)"
    if kind == "IntervalDtype":
        return f"give its ends columns of their own ({col}.array.left, {col}.array.right)"
    if type(first).__qualname__ == "Decimal":
        return (f"cast it ({col}.astype(float); 'int64' or 'uint64' for whole ids, which "
                "floats round)")
    if isinstance(first, str):
        fill = ".fillna('')" if column.isna().any() else ""  # (else 'None' and 'nan')
        if any(isinstance(v, str) and v.endswith("\x00") for v in array):  # (to_numpy(str)
            return ("its strings end with a NUL character ('\\x00') here and there, which "
                    "NumPy's fixed-width strings drop: pass df.to_dict('records') (str "
                    "leaves keep them), or datasets.Dataset.from_pandas(df), which the loader "
                    "reads as it is")  # would cut them, without a word)
        return (f"give its strings as a leaf of their own, ArraySource({{{name!r}: "
                f"{col}{fill}.to_numpy(dtype=str), ...}}) (fixed width), or pass "
                "datasets.Dataset.from_pandas(df), which the loader reads as it is")
    return f"encode it ({col}.astype('category').cat.codes), or pass df.to_dict('records')"


# What a message names a ``Series`` or an Arrow array taken alone by (a record's leaf: its
# path and record, ``batching.frame_leaves``).
SUBJECT: contextvars.ContextVar[str] = contextvars.ContextVar("subject", default="")


def _named(name: str | None) -> str:
    return (SUBJECT.get() or "ArraySource(Series)") if name is None else \
        f"ArraySource(DataFrame): column {name!r}"


def arrow_kind(x: Any) -> str | None:
    """``"table"`` for a pyarrow ``Table`` or ``RecordBatch``, ``"column"`` for an ``Array`` or
    ``ChunkedArray``, else None (pyarrow not imported: None)."""
    pa = sys.modules.get("pyarrow")
    if pa is None or not type(x).__module__.startswith("pyarrow"):
        return None
    return ("table" if isinstance(x, (pa.Table, pa.RecordBatch)) else
            "column" if isinstance(x, (pa.Array, pa.ChunkedArray)) else None)


def arrow_columns(data: Any, path: str | None = None) -> Any:
    """An Arrow table's columns as a dict of NumPy arrays by name (an Arrow array: its values;
    ``path``: the leaf it is), as a frame's: NumPy made one float64 matrix of a table (names
    lost, ids past 2**53 rounded) and NaN of a null."""
    if arrow_kind(data) == "column":
        return _arrow_column(None, data, path)
    names = list(data.schema.names)
    if len(set(names)) != len(names):
        raise ConfigError(f"ArraySource(Table): column names must differ, got {names}; rename "
                          "the repeated ones (table.rename_columns([...]))")
    return {name: _arrow_column(name, data.column(i)) for i, name in enumerate(names)}


def _arrow_column(name: str | None, column: Any, path: str | None = None) -> np.ndarray:
    """An Arrow column as NumPy: numbers, booleans and times without a zone as their NumPy
    dtype, strings fixed-width; nulls, a zone and other types refused, with what to do."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind, named = column.type, SUBJECT.get() or (f"ArraySource leaf {path}" if path else
                                                 "ArraySource(Array)" if name is None else
                                                 f"ArraySource(Table): column {name!r}")
    col = "array" if name is None else f"table[{name!r}]"
    drop = "drop those rows (table.drop_null())" if name is not None else "drop them"
    if pa.types.is_null(kind):  # (fill_null has no value of its type to give)
        raise ConfigError(f"{named} is of Arrow's null type: every value missing; leave it "
                          "out" + (f" (table.drop_columns([{name!r}]))" if name else ""))
    if column.null_count:
        raise ConfigError(
            f"{named} ({kind}) has {column.null_count} null(s), expected values (NumPy would "
            f"hold them as NaN, and integers as floats); fill them (pc.fill_null({col}, 0)) "
            f"or {drop}")
    inner = kind.value_type if pa.types.is_fixed_size_list(kind) else kind
    if pa.types.is_timestamp(inner) and inner.tz is not None:
        naive = f"pa.timestamp({inner.unit!r})"
        raise _zoned(f"{named} is {kind}", f"{col}.cast({naive})" if inner is kind else
                     f"{col}.cast(pa.list_({naive}, {kind.list_size}))")
    if getattr(pa.types, "is_string_view", lambda _: False)(kind):
        column, kind = column.cast(pa.string()), pa.string()  # (as a string column)
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if pa.types.is_fixed_size_list(kind) and _fixed_width(kind.value_type):  # (embeddings:
        flat = [chunk.flatten() for chunk in chunks]  # a row each, as NumPy's 2-D array)
        if any(f.null_count for f in flat):
            raise ConfigError(f"{named} ({kind}) has nulls inside its lists, expected values; "
                              "fill them, or drop those rows")
        return np.concatenate([numpy_of(f) for f in flat] or [numpy_of(pa.array(
            [], kind.value_type))]).reshape(len(column), kind.list_size)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        lengths = pc.utf8_length(column)
        _check_width(named, len(column), pc.sum(lengths).as_py() or 0,
                     pc.max(lengths).as_py() or 0, "table.to_pylist() (records with str leaves)")
        _check_no_trailing_nul(named, bool(pc.any(pc.ends_with(column, "\x00")).as_py()),
                               "table.to_pylist() (records with str leaves)")
        return np.asarray(column.to_pylist(), dtype=str)
    if not _fixed_width(kind):
        remedy = (f"cast it ({col}.cast(pa.float64()); pa.int64() for whole ids, which "
                  "floats round)" if pa.types.is_decimal(kind) else
                  f"decode it ({col}.cast({col}.type.value_type)) or take its codes "
                  f"({col}.combine_chunks().indices)"
                  if pa.types.is_dictionary(kind) else "give its fields columns of their "
                  "own (table.flatten())" if pa.types.is_struct(kind) else
                  "pass table.to_pylist() (records the loader reads as they are; jl.Pad pads "
                  "rows of other lengths), or write it to Parquet and read it with "
                  "ParquetSource")
        raise ConfigError(f"{named} is {kind}, which NumPy holds as Python objects, expected "
                          f"numbers; {remedy}")
    return np.concatenate([numpy_of(chunk) for chunk in chunks]) if chunks else \
        np.asarray(column.to_numpy())


def check_aligned(paths: list[str], leaves: list) -> None:
    """Refuses pandas leaves of one length whose indexes differ: NumPy pairs their rows by
    position where pandas pairs them by label (a ``y`` left in its order after ``X`` was
    sorted or sampled gave features others' labels)."""
    indexed = [(path, leaf.index) for path, leaf in zip(paths, leaves)
               if type(leaf).__module__.startswith("pandas") and hasattr(leaf, "index")]
    for path, index in indexed[1:]:
        first, labels = indexed[0]
        if len(index) == len(labels) and not index.equals(labels):
            import pandas as pd  # (its objects are leaves: imported)

            fresh, other = (first, path) if labels.equals(pd.RangeIndex(len(labels))) else \
                (path, first) if index.equals(pd.RangeIndex(len(index))) else (None, None)
            remedy = (f"{fresh}'s is 0..n-1, as a frame made from an array has (pd.DataFrame("
                      "scaler.fit_transform(X))): where positions pair them, drop the index of "
                      f"the one at {other} (its .reset_index(drop=True)); where 0..n-1 are "
                      "labels too (y = df['label'] of a frame not reordered), align them "
                      "(y = y.loc[X.index])" if fresh else "align them (y = y.loc[X.index]), "
                      "or, where their positions pair them, drop the indexes (X.reset_index("
                      "drop=True), y.reset_index(drop=True))")
            raise ConfigError(
                f"ArraySource: leaves {first} and {path} are pandas objects of other indexes "
                f"({labels[:4].tolist()}... against {index[:4].tolist()}...), whose rows would "
                f"be paired by position, where pandas pairs them by label; {remedy}")


def _fixed_width(kind: Any) -> bool:
    """Whether an Arrow type's values are NumPy's numbers, booleans or times."""
    import pyarrow as pa

    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(
        kind) or pa.types.is_temporal(kind)
