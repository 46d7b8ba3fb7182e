"""What rows of a Hugging Face ``Dataset`` the loader refuses, found as it is made or as a read
fails: the rows where a column holds a null (``null_rows``; NumPy format would give NaN, another
number or ``None``), and the row and column whose read raised (``failing_row``: an image that
does not decode named where it is, not by its batch alone).

Example:
    >>> import pyarrow as pa
    >>> has_nulls(pa.chunked_array([[1, None, 3]]))
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxloader.base.errors import RecordError
from jaxloader.base.read_threads import tag_item
from jaxloader.sources.arrow_columns import nested_nulls
from jaxloader.sources.arrow_numpy import is_list


def null_rows(dataset: Any, key: str, media: bool = False) -> np.ndarray:
    """The dataset's rows (after its ``select``/``filter``/``shuffle``) where column ``key``
    holds a null, its lists' values and its structs' fields included (not an image's, where
    the column's features hold one: ``media``), ascending."""
    column = dataset.data.column(key)
    in_table = np.concatenate([_null_rows_of(c, media) if has_nulls(c, media)
                               else np.zeros(len(c), bool)
                               for c in column.chunks] or [np.zeros(0, bool)])
    mapping = getattr(dataset, "_indices", None)  # (the rows a select or filter kept)
    if mapping is not None:
        in_table = in_table[mapping.column(0).to_numpy()]
    return np.flatnonzero(in_table)


def has_media(feature: Any) -> bool:
    """Whether a ``datasets`` feature is, or holds at any depth, an image, a sound, a video or
    a document (stored as a struct of ``bytes`` and a ``path`` that may be null)."""
    if type(feature).__name__ in ("Image", "Audio", "Video", "Pdf"):
        return True
    if isinstance(feature, dict):
        return any(has_media(f) for f in feature.values())
    if isinstance(feature, (list, tuple)):
        return any(has_media(f) for f in feature)
    return has_media(getattr(feature, "feature", None)) if hasattr(feature, "feature") \
        else False


def _media(kind: Any) -> bool:
    """Whether an Arrow type is how ``datasets`` stores an image or a sound (``Image``,
    ``Audio``): a struct of ``bytes`` and a ``path``, either of which may be null."""
    import pyarrow as pa

    return pa.types.is_struct(kind) and sorted(f.name for f in kind) == ["bytes", "path"]


def _null_rows_of(array: Any, media: bool = False) -> np.ndarray:
    """A row mask of an Arrow array: where it, a value of its lists or a field of its structs
    (not an image's, ``_media``, where the features hold one: ``media``) is null."""
    import pyarrow as pa

    rows = array.is_null().to_numpy(zero_copy_only=False)
    if isinstance(array, pa.StructArray) and not (media and _media(array.type)):
        for field in array.flatten():  # (its offset applied)
            rows |= _null_rows_of(field, media)
    elif isinstance(array, pa.FixedSizeListArray):
        size = array.type.list_size
        if size:
            inner = _null_rows_of(array.values.slice(array.offset * size, len(array) * size),
                                  media)
            rows |= inner.reshape(len(array), size).any(axis=1)
    elif isinstance(array, (pa.ListArray, pa.LargeListArray)):
        # by the offsets: the values behind a null list are in them (not in flatten()'s)
        offsets = array.offsets.to_numpy()
        inner = _null_rows_of(array.values.slice(offsets[0], offsets[-1] - offsets[0]), media)
        if inner.any():
            rows[np.repeat(np.arange(len(array)), np.diff(offsets))[inner]] = True
    return rows


def has_nulls(column: Any, media: bool = False) -> bool:
    """Whether an Arrow column (chunked or not) holds a null, its lists' values and its
    structs' fields included (not an image's, where the features hold one: ``media``):
    Arrow's counts first, the rows walked only where a struct may hide one."""
    def nested(kind: Any) -> bool:
        import pyarrow as pa

        while is_list(kind):
            kind = kind.value_type
        return pa.types.is_struct(kind)

    return any(chunk.null_count or (_null_rows_of(chunk, media).any() if nested(chunk.type)
                                    else nested_nulls(chunk))
               for chunk in getattr(column, "chunks", [column]))


def failing_row(source: Any, indices: Any, error: Exception) -> Exception:
    """Where a batch's read of ``source`` (a ``HuggingFaceSource``) that raised ``error`` fails:
    its rows read one by one, the first that raises read column by column. A ``RecordError``
    naming the row (the dataset's index) and the column, marked as the batch's ``j``-th
    (``tag_item``: the loader names its step and position), or ``error`` where no row alone
    fails. An image that does not decode was named by its batch alone."""
    for j, index in enumerate(np.asarray(indices).tolist()):
        try:
            source[index]
        except Exception as e:  # noqa: BLE001 - the row's own error, whatever it is
            key = _column_of(source, index)
            found: Exception = RecordError(
                f"the dataset's row {index}{f', column {key!r}' if key else ''}"
                f"{_media_path(source, index, key)}: "
                f"{type(e).__name__}: {e}; fix or drop that row (ds.filter, ds.select), or, "
                "for images or sounds that may not decode, read the column undecoded "
                f"(ds.cast_column({key or 'column'!r}, datasets.Image(decode=False))) and "
                "decode it in a Map, which names the record")
            found.__cause__ = e
            tag_item(found, j)
            return found
    return error


def _media_path(source: Any, index: int, key: str | None) -> str:
    """`` (file '...')``: the file an image's or a sound's struct names (an imagefolder's), or
    nothing."""
    try:
        value = source.dataset[index].column(key)[0].as_py() if key else None
    except Exception:  # noqa: BLE001 - (a name only: nothing to add then)
        return ""
    path = value.get("path") if isinstance(value, dict) else None
    return f" (file {path!r})" if isinstance(path, str) and path else ""


def _column_of(source: Any, index: int) -> str | None:
    """The first column whose read of row ``index`` alone raises, or ``None``."""
    if source.custom:  # (a transform's columns: not read one by one)
        return None
    row = source.dataset[index]  # (an Arrow table: decoded as the source does, a column each)
    for key in source._numeric:
        try:
            source._numpy.format_row(row.select([key]))
        except Exception:  # noqa: BLE001 - the column that fails
            return key
    return None
