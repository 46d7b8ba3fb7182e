"""Records (or a batch already made) as validated columns, one a leaf of the batch.

Every record must have the same structure, and each leaf the same shape and dtype, or a
``CollateError`` names the leaf path, both shapes or dtypes, the record positions and the cast
to make; a Python ``int``/``float``/``bool`` batches beside NumPy's scalars of its kind, never
upcast. ``collate`` writes the columns into a buffer.

Example:
    >>> records = [{"x": np.zeros(3, np.float32), "y": i} for i in range(4)]
    >>> treedef, columns = record_columns(records)
    >>> [(c.path, c.shape, str(c.dtype)) for c in columns]
    [("['x']", (4, 3), 'float32'), ("['y']", (4,), 'int64')]
"""

from __future__ import annotations

import sys
from operator import attrgetter
from typing import Any, NamedTuple, Sequence

import numpy as np

from jaxloader.base import tree as tree_lib
from jaxloader.base.columns import object_column
from jaxloader.base.errors import CollateError
from jaxloader.batching.frame_leaves import frame_leaf, refuse_rows
from jaxloader.batching.leaf_mismatch import beyond_int64, raise_leaf_mismatch, scalar_dtype
from jaxloader.batching.object_leaves import (DENSE, check_objects, has_array_protocol, is_sparse,
                                              refuse_object, type_name)

_OBJECT = np.dtype(object)


class Column(NamedTuple):
    path: str
    shape: tuple  # of the whole batch leaf
    dtype: np.dtype
    values: Any  # list of per-record values to stack, or an ndarray already batched
    names: Any = None  # tree.RecordNames (or record positions), for error messages
    # values an ndarray of memory the loader does not own (a source's __getitems__, a batch
    # transform's return): copied where no slot takes it, so that the batch shares nothing
    borrowed: bool = False


_SHAPE = attrgetter("shape")
_SIGNATURE = attrgetter("shape", "dtype")


def _record_column(path: str, values: list, names: Any) -> Column:
    try:
        return _column_of(path, values, names)
    except CollateError:  # (a jax.Array or a tensor after a NumPy value: refused in that order
        if not isinstance(values[0], (np.ndarray, np.generic)):  # alone, as "records differ"
            raise  # and "pad them"; one first is made an array with the others, its checks)
        converted = [_as_array(path, v, j, names)
                     if not isinstance(v, (np.ndarray, np.generic))  # (a masked one: said)
                     and has_array_protocol(v) else v for j, v in enumerate(values)]
        if all(a is b for a, b in zip(converted, values)):
            raise
        return _column_of(path, converted, names)


def _column_of(path: str, values: list, names: Any) -> Column:
    first = values[0]
    n = len(values)
    if isinstance(first, np.ndarray) and first.ndim:
        if any(issubclass(k, np.ma.MaskedArray) for k in set(map(type, values))):
            _refuse_masked(path, values, names)  # (netCDF4's missing data: its fill values)
        # Shapes are checked here; dtypes by the stacking itself (casting="no" refuses any
        # difference), which saves a second pass over the records.
        try:
            same = len(set(map(_SHAPE, values))) == 1
        except AttributeError:  # a Python scalar or an object among the arrays
            same = False
        if not same:
            if first.dtype == object and all(type(v) is np.ndarray and v.dtype == object
                                             and v.ndim == 1 for v in values):
                # lists of strings of other lengths (a Hugging Face List(string) feature): one
                # array a row, as a source's batch gives them (no device form either way),
                # checked as rows of one length are (numbers, Decimals, locks refused)
                for j, v in enumerate(values):
                    check_objects(path, tree_lib.record_name(names, j), v)
                return Column(path, (n,), first.dtype, object_column(values))
            raise_leaf_mismatch(path, values, names)
        for j, v in enumerate(values if first.dtype.hasobject else ()):  # (a lock: batched
            if not v.dtype.hasobject:  # in process only; one value each; numbers after
                raise_leaf_mismatch(path, values, names)  # objects: np.stack took them in)
            if v.size:
                check_objects(path, tree_lib.record_name(names, j), v)
        return Column(path, (n, *first.shape), first.dtype, values, names)
    if isinstance(first, np.ndarray) and first.ndim == 0 and (
            first.dtype.kind in "US"
            or first.dtype.kind == "O" and isinstance(first.item(), (str, bytes))):
        # a NumPy string scalar in an array (fixed width, padded), or a string in a 0-d object
        # array: a Python string instead (not an object array of 0-d arrays)
        return _record_column(path, [v.item() if isinstance(v, np.ndarray) and v.ndim == 0
                                     else v for v in values], names)
    if isinstance(first, (str, bytes)):
        # Strings and bytes stay Python objects on purpose (an object array, one entry a
        # record): they have no device form, and fixed-width NumPy strings would pad them.
        text = str if isinstance(first, str) else bytes  # (one of them: a leaf has one type)
        values = [v.item() if type(v) is np.ndarray and v.ndim == 0 and v.dtype.kind in "USO"
                  else v for v in values]  # (a 0-d text array after a str, as before one)
        if not all(isinstance(v, text) for v in values):
            raise_leaf_mismatch(path, values, names)
        array = np.empty(n, dtype=object)
        array[:] = [v if type(v) is str or type(v) is bytes  # np.str_ -> str, np.bytes_ -> bytes
                    else (str(v) if isinstance(v, str) else bytes(v)) for v in values]
        return Column(path, (n,), array.dtype, array)
    if isinstance(first, (np.ndarray, np.generic)):
        kinds = set(map(type, values))
        if any(issubclass(k, np.ma.MaskedArray) for k in kinds):  # (np.ma.masked: 0-d)
            _refuse_masked(path, values, names)
        if first.dtype.kind in "biufc" and type(first) is not np.ndarray:
            same = len(kinds) == 1  # a numeric scalar type fixes the dtype
        else:
            try:
                same = len(set(map(_SIGNATURE, values))) == 1
            except AttributeError:
                same = False
        if not same:
            return _scalars_of_one_dtype(path, values, names)
        for j, v in enumerate(values if first.dtype.hasobject else ()):  # (0-d: a number, a
            check_objects(path, tree_lib.record_name(names, j), v)  # Decimal, as 1-d ones)
        return Column(path, (n, *first.shape), first.dtype, values, names)
    if isinstance(first, (bool, int, float, complex)):
        if len(set(map(type, values))) != 1:
            return _scalars_of_one_dtype(path, values, names)
        if type(first) is not int:
            array = np.asarray(values)
            return Column(path, array.shape, array.dtype, array)
        try:  # (int64 on every platform; NumPy would pick uint64, float64 or objects beyond)
            array = np.array(values, np.int64)
        except OverflowError:
            raise beyond_int64(path, values, names) from None
        return Column(path, array.shape, array.dtype, array)
    if has_array_protocol(first):  # a torch tensor, a PIL image, a jax.Array...
        refuse_rows(values, f"batch leaf {path}: {tree_lib.record_name(names, 0)}")
        return _record_column(path, [_as_array(path, v, j, names) for j, v in
                                     enumerate(values)], names)
    refuse_object(path, tree_lib.record_name(names, 0), first)


def _refuse_masked(path: str, values: list, names: Any, whole: str | None = None) -> None:
    """A masked array with masked values (netCDF4's read of missing data): its data alone
    would be batched, the fill values as data; refused, named (one without any: its data)."""
    for j, v in enumerate(values):
        if np.ma.is_masked(v):
            raise CollateError(
                f"batch leaf {path}: {whole or tree_lib.record_name(names, j)} is a masked "
                f"array with {np.ma.count_masked(v)} masked value(s), whose mask a batch would "
                "not carry (its fill values would be batched as data); in a Map, fill them "
                "(x.filled(0)) and give the mask a leaf of its own (np.ma.getmaskarray(x))")


def _scalars_of_one_dtype(path: str, values: list, names: Any) -> Column:
    """A column of numeric scalars of other types that batch as one dtype (a Python ``int``
    beside ``np.int64`` ones: a list source mixed with a Parquet one, a Map's default),
    batched as it; any other difference raises, naming the first record that differs."""
    if any(isinstance(v, np.ma.MaskedArray) for v in values):  # (np.ma.masked among floats:
        _refuse_masked(path, values, names)  # a NaN)
    dtypes = {scalar_dtype(v) for v in values}
    if len(dtypes) != 1 or None in dtypes:
        raise_leaf_mismatch(path, values, names)
    dtype = dtypes.pop()
    assert dtype is not None
    return Column(path, (len(values),), dtype, np.array(values, dtype=dtype))


def _as_array(path: str, value: Any, j: int, names: Any) -> np.ndarray:
    """``value`` (a leaf with the array protocol) as NumPy's, or a ``CollateError`` naming it
    (a torch tensor of bfloat16, or one that requires grad, cannot be one)."""
    found = frame_leaf(value, lambda: f"batch leaf {path}: {tree_lib.record_name(names, j)}")
    try:  # (a frame, a Series, an Arrow array: checked as ArraySource checks them)
        return np.asarray(value) if found is None else found
    except Exception as e:  # noqa: BLE001 - (the protocol's own error, whatever it raises)
        kind = f"{type_name(value)} of {getattr(value, 'dtype', '?')}"
        torch = type(value).__module__.startswith("torch")
        raise CollateError(
            f"batch leaf {path}: {tree_lib.record_name(names, j)} is a {kind}, which NumPy "
            f"cannot take ({type(e).__name__}: {e}); in a Map, make it a NumPy array" + (
                " (t.detach().cpu().numpy(); a bfloat16 one: t.float(), or t.view(torch."
                "int16).numpy().view(ml_dtypes.bfloat16) to keep its bits)" if torch else "")
        ) from e


def record_columns(records: list, names: Any = None) -> tuple[tree_lib.TreeDef, list[Column]]:
    """Validated columns of a list of records (``record_name(names, j)`` names ``records[j]``
    in errors: a ``tree.RecordNames``)."""
    if not records:
        raise CollateError("collate: expected at least one record, got an empty list")
    if records[0] is None:  # (a tree of no leaves: a batch of None, without a word)
        raise CollateError(f"collate: {tree_lib.record_name(names, 0)} is None, expected a "
                           "record; return it from what made it (a missing `return`?): the "
                           "source's __getitem__, a stream's generator or Stream.map, or a "
                           "transform")
    try:
        treedef = tree_lib.structure(records[0])
        values = tree_lib.gather(records, treedef, names)
    except RecursionError:  # (JSON nested 900 deep: parsed, then a bare RecursionError here)
        raise CollateError(f"collate: {tree_lib.record_name(names, _deepest(records))} is "
                           "nested deeper than Python's recursion limit lets it be walked "
                           "(dicts and lists in each other); flatten it in a Map (a nested part "
                           "as a JSON string, say)") from None
    paths = tree_lib.leaf_paths(treedef)
    return treedef, [_record_column(p, v, names) for p, v in zip(paths, values)]


def _deepest(records: list) -> int:
    """The first of ``records`` whose dicts, lists and tuples nest deepest (walked without
    recursion: for the error that a recursive walk of it raised; a record that holds itself
    is as deep as the recursion limit)."""
    limit = sys.getrecursionlimit()

    def depth(record: Any) -> int:
        deepest, stack = 0, [(record, 1)]
        while stack:
            node, level = stack.pop()
            if level >= limit:
                return level
            deepest = max(deepest, level)
            children = node.values() if isinstance(node, dict) else node if isinstance(
                node, (list, tuple)) else ()
            stack.extend((c, level + 1) for c in children)
        return deepest

    depths = [depth(r) for r in records]
    return depths.index(max(depths))


def batch_columns(batch: Any, size: int, borrowed: bool = True,
                  owned: Sequence[Any] = ()) -> tuple[tree_lib.TreeDef, list[Column]]:
    """Validated columns of an already batched tree whose leaves have ``size`` rows (memory the
    loader does not own, ``Column.borrowed``, unless ``borrowed`` is false or the leaf is one
    of the arrays it made, ``owned``)."""
    if batch is None:  # (a tree of no leaves: a batch of None, without a word)
        raise CollateError("collate: the batch is None, expected a batch of "
                           f"{size} records; return it from what made it (a missing "
                           "`return`?): the source's __getitems__, or a batch transform")
    leaves, treedef = tree_lib.flatten(batch)
    columns = []
    for path, leaf in zip(tree_lib.leaf_paths(treedef), leaves):
        if isinstance(leaf, np.ma.MaskedArray):  # (np.asarray drops its mask)
            _refuse_masked(path, [leaf], None, "the batch's column")
        found = frame_leaf(leaf, lambda: f"batch leaf {path}: the batch's column")
        array = np.asarray(leaf) if found is None else found
        if array.ndim == 0 or array.shape[0] != size:
            if is_sparse(leaf):  # (np.asarray: one object, "got shape ()")
                raise CollateError(f"batch leaf {path}: a SciPy sparse {type(leaf).__name__} "
                                   f"of shape {leaf.shape}, which no batch holds; {DENSE}")
            listed = ("; a list or tuple in a batch is a pytree node, not a column: give a "
                      "column of rows as an array (np.asarray(rows), dtype=object for "
                      "strings), or return a list of records from __getitems__"
                      if path.endswith("]") and path.rsplit("[", 1)[1][:-1].isdigit() else "")
            raise CollateError(
                f"batch leaf {path}: expected {size} rows (the batch size) along axis 0, got "
                f"shape {array.shape}; a batch transform or __getitems__ must keep the batch "
                f"axis{listed}")
        if array.dtype.hasobject and array.size:  # (a Parquet decimal, numbers as objects)
            check_objects(path, "the batch's value", array, by_row=True)
        columns.append(Column(path, array.shape, array.dtype, array, None,
                              borrowed and not any(array is made for made in owned)))
    return treedef, columns
