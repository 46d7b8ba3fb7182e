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
from typing import Any, NamedTuple, NoReturn, Sequence

import numpy as np

from jaxloader.base import tree as tree_lib
from jaxloader.base.columns import object_column
from jaxloader.base.errors import CollateError
from jaxloader.batching.frame_leaves import frame_leaf, refuse_rows
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
            j = next(j for j, v in enumerate(values) if not -2**63 <= v < 2**63)
            raise CollateError(
                f"batch leaf {path}: {tree_lib.record_name(names, j)} holds the int "
                f"{values[j]}, beyond int64 (-2**63..2**63-1), which Python ints batch as "
                "(a batch of them would come out as another dtype than the others); keep it "
                "as a string, split it into int64 parts, or make it np.uint64(x), in a Map"
            ) from None
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


def _one_dtype(a: np.dtype, b: np.dtype) -> str:
    """What to do with records whose leaf is of dtypes ``a`` and ``b`` alone: the first's cut
    a longer string, zeroed a float image as uint8; a float rounds an id past 2**53."""
    kinds = {a.kind, b.kind}
    if kinds <= {"U", "S"}:  # (fixed-width text: the next record may be longer still)
        return ("cast every record's to one width, the dataset's longest (np.asarray(x, "
                f"'{'<S' if kinds == {'S'} else '<U'}64') for 64 characters), or, for one "
                "string a record, give it as a str (str(x.item()), which batches at any length"
                + ("; bytes: x.item().decode()" if "S" in kinds else "") + ")")
    if kinds == {"i", "u"}:
        return ("give every record one dtype there: cast in a Map (np.asarray(x, 'int64'); "
                "'uint64' for ids past 2**63)")
    if "O" in kinds:  # (objects, text say, beside numbers: an object array of them is refused)
        return ("give every record one kind there: the numbers as numbers, the text as text "
                "(parse it, or make the numbers text), in a Map")
    try:
        both = f"np.asarray(x, '{np.result_type(a, b)}'), say"
    except TypeError:  # (no dtype holds both: a date and a number)
        both = "to the one your data needs"
    return f"give every record one dtype there: cast in a Map ({both})"


_PYTHON_DTYPES = {bool: np.dtype(bool), int: np.dtype(np.int64), float: np.dtype(np.float64),
                  complex: np.dtype(np.complex128)}


def _scalar_dtype(value: Any) -> np.dtype | None:
    """The dtype a numeric scalar batches as: a NumPy scalar's (or 0-d array's) own, a Python
    one's default (``int``: int64, where it fits); ``None`` for anything else."""
    kind = type(value)
    if kind not in _PYTHON_DTYPES and not isinstance(value, np.generic):  # (an IntEnum: int's,
        kind = next((t for t in (int, float, complex) if isinstance(value, t)), kind)  # as
    if kind in _PYTHON_DTYPES:  # a batch of them alone batches)
        return _PYTHON_DTYPES[kind] if kind is not int or -2**63 <= value < 2**63 else None
    if isinstance(value, (np.generic, np.ndarray)) and value.ndim == 0 and (
            value.dtype.kind in "biufc"):
        return value.dtype
    return None


def _scalars_of_one_dtype(path: str, values: list, names: Any) -> Column:
    """A column of numeric scalars of other types that batch as one dtype (a Python ``int``
    beside ``np.int64`` ones: a list source mixed with a Parquet one, a Map's default),
    batched as it; any other difference raises, naming the first record that differs."""
    if any(isinstance(v, np.ma.MaskedArray) for v in values):  # (np.ma.masked among floats:
        _refuse_masked(path, values, names)  # a NaN)
    dtypes = {_scalar_dtype(v) for v in values}
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


def _missing(value: Any) -> bool:
    return value is None or type(value).__name__ in ("NAType", "NaTType")


def raise_leaf_mismatch(path: str, values: list, names: Any) -> NoReturn:
    try:  # (a jax.Array, a tensor: said and compared as the array it batches as)
        values = [np.asarray(v) if not isinstance(v, (np.ndarray, np.generic))
                  and has_array_protocol(v) else v for v in values]
    except Exception:  # noqa: BLE001 - (one that does not convert: said as it is)
        pass

    def kind(v: Any) -> tuple:  # what records must share (a value's own is its own)
        if isinstance(v, (str, bytes)):  # (np.str_ is a str)
            return (str if isinstance(v, str) else bytes, None)
        if isinstance(v, (np.ndarray, np.generic)):
            return (v.shape, v.dtype)
        return (type(v), _scalar_dtype(v))

    def describe(v: Any) -> str:
        if isinstance(v, (np.ndarray, np.generic)):
            return f"shape {v.shape} dtype {v.dtype}"
        dtype = _scalar_dtype(v)
        batched = f" (batched as {dtype})" if dtype is not None else ""
        return "None" if v is None else f"{type_name(v)} {v!r:.40}{batched}"

    first = kind(values[0])
    for j, v in enumerate(values):
        if kind(v) != first:
            if _missing(v) or _missing(values[0]):  # (None, pandas' NA and NaT)
                fix = f"give every record {_none_fill(values[0] if _missing(v) else v)} " \
                    f"there, not {v if _missing(v) else values[0]}"
            elif first[0] in (str, bytes) and kind(v)[0] in (str, bytes):
                fix = ("give every record one of them there: decode the bytes (or encode the "
                       "str) in a Map")
            elif _scalar_dtype(v) is not None and (dtype := _scalar_dtype(values[0])) is not None:
                fix = _one_dtype(np.dtype(dtype), np.dtype(_scalar_dtype(v)))  # (the first's
                # zeroed 0.5 as uint8, wrapped a uint64 id as int64: the third review)
            elif isinstance(v, (np.ndarray, np.generic)) and isinstance(values[0], (
                    np.ndarray, np.generic)) and v.shape == values[0].shape:  # (told to pad:
                # Pad and batch_size=1 refuse; datetime64 of seconds beside milliseconds)
                fix = _one_dtype(values[0].dtype, v.dtype)
            elif isinstance(v, np.ndarray) and isinstance(values[0], np.ndarray) and \
                    v.ndim == values[0].ndim > 1 and v.shape[1:] != values[0].shape[1:]:
                fix = ("make every record's leaf one shape in a Map: resize, crop or pad it "
                       "there (a Pad pads the first axis only, and these differ past it: "
                       "images of other sizes, say), or use batch_size=1")
            elif (first[0] in (str, bytes)) != (kind(v)[0] in (str, bytes)):  # (no Pad: text)
                fix = ("give every record one kind there: parse the text to a number, or make "
                       "the number text (str(x)), in a Map")
            elif _image_modes(values[0], v):
                fix = ("images of other modes (grayscale, RGBA, a palette) among RGB ones: "
                       "convert each as it is decoded, Image.open(...).convert('RGB')")
            else:
                top = path.count("[") == 1 and path[:2] == "['"
                pad = (f"pad them to the batch's longest with jaxloader.Pad({path[2:-2]!r}) "
                       "after the Maps" if top else "a Pad pads a record's top-level keys: "
                       "return this leaf under a key of its own from a Map, then pad it with "
                       "jaxloader.Pad")
                fix = (f"make every record's leaf the same shape and dtype ({pad}, or pad or "
                       "crop in a Map; 1-D token arrays: jaxloader.PackedSource, or "
                       "PackedStream for a stream), or use batch_size=1")
            raise CollateError(
                f"batch leaf {path}: records differ: {tree_lib.record_name(names, 0)} has "
                f"{describe(values[0])}, {tree_lib.record_name(names, j)} has "
                f"{describe(v)}; {fix}"
            )
    raise CollateError(f"batch leaf {path}: records differ in type")


def _none_fill(given: Any) -> str:
    """What a record with None where others have ``given`` may hold instead."""
    if isinstance(given, (str, bytes)):  # (a caption's: text, not an array)
        empty = "''" if isinstance(given, str) else "b''"
        return (f"a {type(given).__name__} ({empty} where it has none, and a flag of your own "
                "where that must be told apart)")
    if _scalar_dtype(given) is not None:
        return "a number (a fill value, and a flag or mask where that must be told apart)"
    return "an array (an empty or a masked one)"


def _image_modes(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` look like pictures of one size in two image modes: ``(h, w)``
    or ``(h, w, c)``, ``c`` 1, 3 or 4, of uint8 or uint16, one of 3 or 4 channels."""
    if not all(getattr(v, "dtype", None) in (np.uint8, np.uint16) for v in (a, b)):
        return False
    channels = [1 if v.ndim == 2 else v.shape[2] if v.ndim == 3 else 0 for v in (a, b)]
    return a.shape[:2] == b.shape[:2] and 0 not in channels and set(channels) <= {1, 3, 4} \
        and channels[0] != channels[1] and max(channels) >= 3


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
