"""A pandas or polars ``Series`` or ``DataFrame``, or an Arrow array, met as a leaf of a record
or of a batch (a source whose ``__getitem__`` returns ``{"row": df.iloc[i]}``, or whose
``__getitems__`` returns a frame's columns): taken as ``ArraySource`` takes one, its nulls, time
zones and several dtypes refused, named by its leaf and record, where ``np.asarray`` made NaN of
a null, floats of nullable ints, and one float64 array of a row of ints and floats (ids past
2**53 rounded), without a word.

Example:
    >>> import pandas as pd
    >>> frame_leaf(pd.Series([1, 2], dtype="Int64"), lambda: "batch leaf ['x']").tolist()
    [1, 2]
    >>> frame_leaf([1, 2], lambda: "batch leaf ['x']") is None
    True
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from jaxloader.base.errors import CollateError, ConfigError
from jaxloader.sources.frames import (FRAME_AS_ONE, SUBJECT, arrow_columns, arrow_kind,
                                      as_series, frame_columns, is_data_frame,
                                      one_kind_of_numbers)


_FRAME_MODULES = ("pandas", "polars", "pyarrow")


def frame_leaf(value: Any, subject: Callable[[], str]) -> np.ndarray | None:
    """``value`` as NumPy where it is a frame, a ``Series`` or an Arrow array (``None`` for
    any other leaf, told by its module first: a torch tensor or PIL image pays one look),
    refused with a ``CollateError`` whose message starts with ``subject()`` where
    ``np.asarray`` would lose or change its values."""
    if type(value).__module__.partition(".")[0] not in _FRAME_MODULES:
        return None
    kind, value = arrow_kind(value), as_series(value)
    if not is_data_frame(value) and kind is None:
        return None
    if kind == "column" and not _nulls_made_nan(value):  # (np.asarray's: strings, lists and
        return None  # structs as objects, as before; a record's states restore)
    if kind == "table" or (is_data_frame(value) and type(value).__name__ == "DataFrame"
                           and not one_kind_of_numbers(value)):
        raise CollateError(
            f"{subject()} is a {type(value).__name__} of columns of several dtypes or with "
            f"nulls, {FRAME_AS_ONE}; return its columns as leaves of their own ({{'age': "
            "df['age'].to_numpy(), ...}), or read the frame with jl.ArraySource(df), whose "
            "records are dicts of its columns")
    if is_data_frame(value) and type(value).__name__ == "DataFrame":
        return np.asarray(value.to_numpy())  # (one dtype of numbers: exact)
    token = SUBJECT.set(subject())
    try:
        return np.asarray(arrow_columns(value) if kind else frame_columns(value))
    except ConfigError as e:
        raise CollateError(str(e)) from None
    finally:
        SUBJECT.reset(token)


def refuse_rows(values: list, subject: str) -> None:
    """Refuses records whose leaf is a pandas ``DataFrame``'s row (``df.iloc[i]``): ``Series``
    of the same labels (the frame's columns) named by rows' labels, whose values pandas
    cast to one dtype before a loader sees them (ids past 2**53 rounded beside a float
    column), their names an index no batch holds; rows of ints or bools, cast to nothing, are
    taken. Windows of a series (one name, labels that move) are not rows; one record alone
    cannot tell."""
    first = values[0]
    if len(values) < 2 or not (type(first).__module__.startswith("pandas") and
                               type(first).__name__ == "Series"):
        return
    if first.dtype.kind in "fcO" and all(  # (of ints or bools: nothing cast, taken as before)
            type(v) is type(first) and v.index.equals(first.index) for v in values[1:]) and \
            _row_labels([v.name for v in values]):
        raise CollateError(
            f"{subject} is a pandas Series indexed by {list(first.index)[:5]!r:.120}, each "
            f"record's named by a label: a DataFrame's row, whose values pandas cast to "
            f"one dtype ({first.dtype}: int64 ids past 2**53 rounded beside a float column, "
            "numbers as objects beside a column of strings), its names an index no "
            "batch holds; the row's values are cast already (row.to_dict() keeps them so): "
            "read the frame's own columns, {c: df[c].iat[i] for c in df} or "
            "df.iloc[[i]].to_dict('records')[0], or read the frame with jl.ArraySource(df), "
            "whose records are dicts of its columns (a Series of features: .to_numpy())")


def _row_labels(names: list) -> bool:
    """Whether Series' ``names`` are rows' labels: each its own (a frame's index), or one
    integer for all (``pd.concat`` without ``ignore_index`` labels each row 0); not one name
    for all (a column's windows, a named vector of features)."""
    if len(set(names)) == len(names):
        return True
    return len(set(names)) == 1 and isinstance(names[0], (int, np.integer)) and not \
        isinstance(names[0], (bool, np.bool_))


def _nulls_made_nan(array: Any) -> bool:
    """Whether ``np.asarray`` of an Arrow array would make its nulls NaN (and its ints floats):
    numbers with a null; other types keep theirs as ``None`` among objects."""
    import pyarrow as pa

    kind = array.type
    return bool(array.null_count) and (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                                       or pa.types.is_boolean(kind))
