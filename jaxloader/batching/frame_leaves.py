"""A pandas or polars ``Series`` or ``DataFrame``, or an Arrow array, met as a leaf of a record
or of a batch (a source whose ``__getitem__`` returns ``{"row": df.iloc[i]}``, or whose
``__getitems__`` returns a frame's columns): taken as ``ArraySource`` takes one, its nulls, time
zones and several dtypes refused, named by its leaf and record, where ``np.asarray`` made NaN of
a null, floats of nullable ints, and one float64 array of a row of ints and floats (ids past
2**53 rounded), without a word.

Example:
    >>> import pandas as pd
    >>> frame_leaf(pd.Series([1, 2], dtype="Int64"), "batch leaf ['x']").tolist()
    [1, 2]
    >>> frame_leaf([1, 2], "batch leaf ['x']") is None
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxloader.base.errors import CollateError, ConfigError
from jaxloader.sources.frames import (SUBJECT, arrow_columns, arrow_kind, as_series,
                                      frame_columns, is_data_frame, one_kind_of_numbers)


def frame_leaf(value: Any, subject: str, record: bool = True) -> np.ndarray | None:
    """``value`` as NumPy where it is a frame, a ``Series`` or an Arrow array (``None`` for
    any other leaf), refused with a ``CollateError`` whose message starts with ``subject``
    where ``np.asarray`` would lose or change its values; ``record``: a record's leaf (a
    ``Series`` indexed by names is a frame's row), not a batch's column."""
    kind, value = arrow_kind(value), as_series(value)
    if not is_data_frame(value) and kind is None:
        return None
    if kind == "table" or (is_data_frame(value) and type(value).__name__ == "DataFrame"
                           and not one_kind_of_numbers(value)):
        raise CollateError(
            f"{subject} is a {type(value).__name__} of columns of several dtypes or with nulls, "
            "which NumPy would make one array of one dtype (its column names lost, int64 ids "
            "past 2**53 rounded in float64, a null NaN); return its columns as leaves of their "
            "own ({'age': df['age'].to_numpy(), ...}), or read the frame with "
            "jl.ArraySource(df), whose records are dicts of its columns")
    if is_data_frame(value) and type(value).__name__ == "DataFrame":
        return np.asarray(value.to_numpy())  # (one dtype of numbers: exact)
    if record and type(value).__module__.startswith("pandas") and getattr(
            value.index.dtype, "kind", "") == "O":  # (labels: objects or pandas' strings)
        raise CollateError(  # (df.iloc[i]: its columns cast to one dtype before we see it)
            f"{subject} is a pandas Series indexed by {list(value.index)[:5]!r:.120}: a "
            f"DataFrame's row, whose values pandas cast to one dtype ({value.dtype}: int64 ids "
            "past 2**53 rounded in float64, ints as floats beside a float column), its names "
            "as an index no batch holds; return the row as a dict of its columns "
            "(row.to_dict(), or {'age': row['age'], ...}), or read the frame with "
            "jl.ArraySource(df), whose records are dicts of its columns")
    token = SUBJECT.set(subject)
    try:
        return np.asarray(arrow_columns(value) if kind else frame_columns(value))
    except ConfigError as e:
        raise CollateError(str(e)) from None
    finally:
        SUBJECT.reset(token)
