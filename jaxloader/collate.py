"""Batch layout and stacking of records into a given buffer.

::

    records ─┐                       ┌─> Layout (treedef, per-leaf path/shape/dtype/offset)
             ├─ columns (one a leaf) ┤
    batch  ──┘  (validated)          └─> write into buffer (one copy) ─> NumPy views, zero copy

A *column* holds one leaf of the batch: either the per-record values still to stack, or an
already-batched array (from a vectorised ``__getitems__``). Columns are validated before anything
is written: every record must have the same structure, and each leaf the same shape and dtype, or
a ``CollateError`` names the leaf path, both shapes/dtypes and the record positions.

Numeric leaves go into one flat byte buffer, each at a 64-byte aligned offset. Anything with the
array protocol (a torch tensor, a PIL image, a ``jax.Array``) becomes a NumPy array; ``str`` and
``bytes`` stay Python objects (an object array, which cannot live in shared memory and travels
beside it); any other object is refused with the leaf's path and what to do.

Example:
    >>> records = [{"x": np.zeros(3, np.float32), "y": i} for i in range(4)]
    >>> batch, layout = materialize(*record_columns(records))
    >>> batch["x"].shape, batch["y"].tolist(), layout.nbytes
    ((4, 3), [0, 1, 2, 3], 128)
"""

from __future__ import annotations

import math
from operator import attrgetter
from typing import Any, Callable, NamedTuple, NoReturn

import numpy as np

from jaxloader import tree as tree_lib
from jaxloader.errors import CollateError
from jaxloader.string_column import StringColumn, split

_ALIGN = 64  # bytes: cache-line alignment of every leaf in a buffer
_OBJECT = np.dtype(object)


# A leaf's offset when it is not at a fixed place in the buffer: object leaves travel beside it;
# strings (or bytes) gathered as a ``StringColumn`` are written after the numbers, one leaf
# after another, and only their sizes in bytes travel beside the buffer, in the leaves' place
# (an int is cheaper to pickle than any object: ``jaxloader.string_column``).
BESIDE, TEXT_AFTER, BYTES_AFTER = -1, -2, -3


class LeafSpec(NamedTuple):
    """One leaf of a batch: its path, full batch shape, dtype and byte offset in the buffer."""

    path: str
    shape: tuple
    dtype: np.dtype
    offset: int  # BESIDE, TEXT_AFTER or BYTES_AFTER for object leaves: no fixed place

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class Layout(NamedTuple):
    """Tree structure, shapes and dtypes of a batch: plain data that crosses processes."""

    treedef: tree_lib.TreeDef
    leaves: tuple[LeafSpec, ...]
    nbytes: int

    def views(self, buffer: Any, objects: list | None = None) -> Any:
        """The batch as NumPy arrays over ``buffer`` (no copy); object leaves from ``objects``,
        where the size in bytes stands for strings written into ``buffer`` after the numbers."""
        return tree_lib.unflatten(self.treedef, self.leaf_views(buffer, objects))

    def leaf_views(self, buffer: Any, objects: list | None = None) -> list:
        """``views`` as a list of leaves, in treedef order."""
        objs = iter(objects or ())
        after = self.nbytes
        leaves = []
        for spec in self.leaves:
            if spec.offset >= 0:  # (positional: 1.0 against 1.8 us with keywords)
                leaves.append(np.ndarray(spec.shape, spec.dtype, buffer, spec.offset))
                continue
            leaf = next(objs)
            if spec.offset != BESIDE:  # strings after the numbers: ``leaf`` is their bytes
                nbytes, after = leaf, after + leaf
                leaf = split(buffer[after - nbytes:after], spec.shape[0],
                             spec.offset == TEXT_AFTER)
            leaves.append(leaf)
        return leaves

    def size(self, objects: list) -> int:
        """The bytes of ``buffer`` a batch of this layout uses, with its strings after."""
        return self.nbytes + sum(o for o in objects if type(o) is int)  # (else arrays)


class _Column(NamedTuple):
    path: str
    shape: tuple  # of the whole batch leaf
    dtype: np.dtype
    values: Any  # list of per-record values to stack, or an ndarray already batched
    positions: Any = None  # record positions, for error messages


_SHAPE = attrgetter("shape")
_SIGNATURE = attrgetter("shape", "dtype")


def _record_column(path: str, values: list, positions: Any) -> _Column:
    first = values[0]
    n = len(values)
    if isinstance(first, np.ndarray) and first.ndim:
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
                # array a row, as a source's batch gives them (no device form either way)
                return _Column(path, (n,), first.dtype, object_column(values))
            _raise_leaf_mismatch(path, values, positions)
        return _Column(path, (n, *first.shape), first.dtype, values, positions)
    if isinstance(first, np.ndarray) and first.ndim == 0 and first.dtype.kind in "US":
        # a NumPy string scalar in an array (fixed width, padded): a Python string instead
        return _record_column(path, [v.item() if isinstance(v, np.ndarray) else v
                                     for v in values], positions)
    if isinstance(first, (str, bytes)):
        # Strings and bytes stay Python objects on purpose (an object array, one entry a
        # record): they have no device form, and fixed-width NumPy strings would pad them.
        if not all(isinstance(v, (str, bytes)) for v in values):
            _raise_leaf_mismatch(path, values, positions)
        array = np.empty(n, dtype=object)
        array[:] = [v if type(v) is str or type(v) is bytes  # np.str_ -> str, np.bytes_ -> bytes
                    else (str(v) if isinstance(v, str) else bytes(v)) for v in values]
        return _Column(path, (n,), array.dtype, array)
    if isinstance(first, (np.ndarray, np.generic)):
        if first.dtype.kind in "biufc" and type(first) is not np.ndarray:
            same = len(set(map(type, values))) == 1  # a numeric scalar type fixes the dtype
        else:
            try:
                same = len(set(map(_SIGNATURE, values))) == 1
            except AttributeError:
                same = False
        if not same:
            return _scalars_of_one_dtype(path, values, positions)
        return _Column(path, (n, *first.shape), first.dtype, values, positions)
    if isinstance(first, (bool, int, float, complex)):
        if len(set(map(type, values))) != 1:
            return _scalars_of_one_dtype(path, values, positions)
        array = np.asarray(values)
        return _Column(path, array.shape, array.dtype, array)
    if _has_array_protocol(first):  # a torch tensor, a PIL image, a jax.Array...
        return _record_column(path, [np.asarray(v) for v in values], positions)
    hint = ""
    if type(first).__module__ == "__main__":
        hint = (" (a class from __main__ or a notebook reaches worker processes by value, "
                "without its JAX registration: define it in a module, or use num_workers=0)")
    raise CollateError(
        f"batch leaf {path}: {tree_lib.record_name(positions, 0)} holds a {_type_name(first)}, which is "
        "neither an array (nor has the array protocol), a number, a string nor a pytree node; "
        "convert it in a Map (np.asarray(x), or str(x)), or register its class as a JAX "
        f"pytree node (jax.tree_util.register_dataclass) in a module the workers can import{hint}"
    )


_PYTHON_DTYPES = {bool: np.dtype(bool), int: np.dtype(np.int64), float: np.dtype(np.float64),
                  complex: np.dtype(np.complex128)}


def _scalar_dtype(value: Any) -> np.dtype | None:
    """The dtype a numeric scalar batches as: a NumPy scalar's (or 0-d array's) own, a Python
    one's default (``int``: int64, where it fits); ``None`` for anything else."""
    kind = type(value)
    if kind in _PYTHON_DTYPES:
        return _PYTHON_DTYPES[kind] if kind is not int or -2**63 <= value < 2**63 else None
    if isinstance(value, (np.generic, np.ndarray)) and value.ndim == 0 and (
            value.dtype.kind in "biufc"):
        return value.dtype
    return None


def _scalars_of_one_dtype(path: str, values: list, positions: Any) -> _Column:
    """A column of numeric scalars of other types that batch as one dtype (a Python ``int``
    beside ``np.int64`` ones: a list source mixed with a Parquet one, a Map's default),
    batched as it; any other difference raises, naming the first record that differs."""
    dtypes = {_scalar_dtype(v) for v in values}
    if len(dtypes) != 1 or None in dtypes:
        _raise_leaf_mismatch(path, values, positions)
    dtype = dtypes.pop()
    assert dtype is not None
    return _Column(path, (len(values),), dtype, np.array(values, dtype=dtype))


def object_column(values: list) -> np.ndarray:
    """``values`` as a 1-D object array, one entry each: rows that are arrays are set one by
    one (NumPy would stack rows of one shape into more axes); strings in one assignment.

    Example:
        >>> object_column([np.zeros(2), np.ones(2)]).shape
        (2,)
    """
    out = np.empty(len(values), dtype=object)
    if values and isinstance(values[0], (str, bytes)):
        out[:] = values
    else:
        for j, value in enumerate(values):
            out[j] = value
    return out


def _has_array_protocol(value: Any) -> bool:
    return any(hasattr(value, a) for a in ("__array__", "__array_interface__",
                                           "__array_struct__"))


def _type_name(value: Any) -> str:
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _raise_leaf_mismatch(path: str, values: list, positions: Any) -> NoReturn:
    def kind(v: Any) -> tuple:  # what records must share (a value's own is its own)
        if isinstance(v, (np.ndarray, np.generic)):
            return (v.shape, v.dtype)
        return (type(v), _scalar_dtype(v))

    def describe(v: Any) -> str:
        if isinstance(v, (np.ndarray, np.generic)):
            return f"shape {v.shape} dtype {v.dtype}"
        dtype = _scalar_dtype(v)
        batched = f" (batched as {dtype})" if dtype is not None else ""
        return "None" if v is None else f"{_type_name(v)} {v!r:.40}{batched}"

    first = kind(values[0])
    for j, v in enumerate(values):
        if kind(v) != first:
            if v is None:
                fix = "give every record an array there (an empty or a masked one), not None"
            elif _scalar_dtype(v) is not None and (dtype := _scalar_dtype(values[0])) is not None:
                fix = (f"give every record one dtype there: cast in a Map (np.asarray(x, "
                       f"'{dtype}'), say)")
            else:
                fix = ("make every record's leaf the same shape and dtype (pad or crop in a "
                       "Map; 1-D token arrays: jaxloader.PackedSource, or PackedStream for a "
                       "stream), or use batch_size=1")
            raise CollateError(
                f"batch leaf {path}: records differ: {tree_lib.record_name(positions, 0)} has "
                f"{describe(values[0])}, {tree_lib.record_name(positions, j)} has "
                f"{describe(v)}; {fix}"
            )
    raise CollateError(f"batch leaf {path}: records differ in type")


def record_columns(records: list, positions: Any = None) -> tuple[tree_lib.TreeDef, list[_Column]]:
    """Validated columns of a list of records (``positions[j]`` names ``records[j]``)."""
    if not records:
        raise CollateError("collate: expected at least one record, got an empty list")
    treedef = tree_lib.structure(records[0])
    paths = tree_lib.leaf_paths(treedef)
    values = tree_lib.gather(records, treedef, positions)
    return treedef, [_record_column(p, v, positions) for p, v in zip(paths, values)]


def batch_columns(batch: Any, size: int) -> tuple[tree_lib.TreeDef, list[_Column]]:
    """Validated columns of an already batched tree whose leaves have ``size`` rows."""
    leaves, treedef = tree_lib.flatten(batch)
    columns = []
    for path, leaf in zip(tree_lib.leaf_paths(treedef), leaves):
        array = np.asarray(leaf)
        if array.ndim == 0 or array.shape[0] != size:
            raise CollateError(
                f"batch leaf {path}: expected {size} rows (the batch size) along axis 0, got "
                f"shape {array.shape}; a batch transform or __getitems__ must keep the batch axis"
            )
        columns.append(_Column(path, array.shape, array.dtype, array))
    return treedef, columns


class Take(NamedTuple):
    """A leaf still to gather: rows ``indices`` of ``array`` (written straight into a slot;
    ``indices`` in range, as a sampler's or a join's rows are: taken with ``mode="clip"``)."""

    array: np.ndarray
    indices: np.ndarray

    def rows(self, a: int, b: int) -> "Take":
        """Rows ``a`` to ``b`` of it, still to gather."""
        return Take(self.array, self.indices[a:b])

    def taken(self, out: np.ndarray | None = None) -> np.ndarray:
        """The rows gathered (into ``out`` when given). ``mode="clip"`` avoids the buffered
        copy NumPy makes for ``out=`` under the default ``mode="raise"`` (3.5x)."""
        return self.array.take(self.indices, 0, out, "clip")


def take_columns(treedef: tree_lib.TreeDef, arrays: list, indices: np.ndarray) -> tuple:
    """Columns gathering ``indices`` from each array, without an intermediate copy."""
    paths = tree_lib.leaf_paths(treedef)
    n = len(indices)
    return treedef, [_Column(p, (n, *a.shape[1:]), a.dtype, Take(a, indices))
                     for p, a in zip(paths, arrays)]


class _TakeParts(NamedTuple):
    """A leaf still to gather from several arrays: ``rows[k]`` of the batch are rows
    ``local[k]`` of ``arrays[k]`` (the parts of a ``ConcatSource`` of alike arrays)."""

    arrays: list
    rows: list
    local: list


def take_parts_columns(treedef: tree_lib.TreeDef, part_arrays: list[list], rows: list,
                       local: list) -> tuple:
    """Columns gathering, for each part ``k``, rows ``local[k]`` of ``part_arrays[k]`` into
    batch rows ``rows[k]`` (parts alike in structure, dtypes and shapes)."""
    paths = tree_lib.leaf_paths(treedef)
    n = sum(len(r) for r in rows)
    return treedef, [_Column(p, (n, *a.shape[1:]), a.dtype,
                             _TakeParts([arrays[i] for arrays in part_arrays], rows, local))
                     for i, (p, a) in enumerate(zip(paths, part_arrays[0]))]


def add_leaf(treedef: tree_lib.TreeDef, columns: list, key: str, array: np.ndarray,
             why: str = "last_batch='pad'") -> tuple:
    """Appends ``array`` as leaf ``key`` of a dict batch (used for the pad mask, which
    ``why`` adds)."""
    if treedef[0] != "dict":
        other = (", or use last_batch='drop'" if why.startswith("last_batch") else
                 " (a Map(lambda r: {'record': r}) wraps one)")
        raise CollateError(
            f"{why} adds a {key!r} leaf to each batch, so records must be dicts; got "
            f"{tree_lib.describe(treedef)}; return a dict from a Map{other}"
        )
    if key in treedef[1]:
        raise CollateError(
            f"{why} adds the leaf {key!r}, but records already have a key {key!r}; "
            "pass another mask_key= to the loader"
        )
    return tree_lib.with_leaf(treedef, key), [*columns, _Column(f"[{key!r}]", array.shape,
                                                                array.dtype, array)]


def layout_of(treedef: tree_lib.TreeDef, columns: list) -> Layout:
    """Places numeric leaves at aligned offsets; object leaves get a negative one
    (``TEXT_AFTER`` or ``BYTES_AFTER`` for a ``StringColumn``, else ``BESIDE``)."""
    specs, offset = [], 0
    for c in columns:
        if c.dtype.hasobject:
            specs.append(LeafSpec(c.path, c.shape, c.dtype, BESIDE if type(c.values) is not
                                  StringColumn else TEXT_AFTER if c.values.text else BYTES_AFTER))
            continue
        specs.append(LeafSpec(c.path, c.shape, c.dtype, offset))
        offset += -(-specs[-1].nbytes // _ALIGN) * _ALIGN
    return Layout(treedef, tuple(specs), offset)


def materialize(
    treedef: tree_lib.TreeDef, columns: list, alloc: Callable[[int], Any] | None = None
) -> tuple[Any, Layout]:
    """Builds the batch: into ``alloc(nbytes)`` when given (one copy), else fresh arrays.
    In the buffer, the strings of a ``StringColumn`` follow the numbers, and the batch holds
    their size in bytes in their place (what ``Layout.views`` reads them back with)."""
    layout = layout_of(treedef, columns)
    if alloc is None:
        arrays = [_stack(c) for c in columns]
        return tree_lib.unflatten(treedef, arrays), layout
    after = [c.values for c in columns if type(c.values) is StringColumn]
    buffer = alloc(layout.nbytes + sum(len(s.data) for s in after))
    leaves: list[Any] = []
    at = layout.nbytes
    for column, spec in zip(columns, layout.leaves):
        if spec.offset >= 0:
            leaves.append(_stack(column, np.ndarray(spec.shape, spec.dtype, buffer=buffer,
                                                     offset=spec.offset)))
        elif spec.offset != BESIDE:
            data = column.values.data
            if len(data):
                np.frombuffer(buffer, np.uint8, len(data), at)[:] = data
            leaves.append(len(data))
            at += len(data)
        else:
            leaves.append(_stack(column))
    return tree_lib.unflatten(treedef, leaves), layout


def write_rows(layout: Layout, columns: dict[str, Any], a: int, b: int,
               alloc: Callable[[int], Any]) -> dict[str, Any]:
    """Rows ``a`` to ``b`` of a task's gathered ``columns`` (a flat dict of arrays, ``Take``s
    and ``StringColumn``s, as ``gathered_columns`` takes them) written into ``alloc``, as
    ``materialize`` writes them, with ``layout`` computed once for the task's steps (all of
    one size; no leaf ``BESIDE``): no columns, layout or pytree made a step (a worker's
    writes of 256 Parquet rows 49 -> 37 us a batch, docs/benchmarks.md). A step's strings
    are copied from where the task's ``StringColumn`` holds them (``span``), no column made
    for them, by slice assignment (0.6 against 2.1 us through ``np.frombuffer``)."""
    spans = []  # each StringColumn's bytes for these rows
    nbytes = layout.nbytes
    for c in columns.values():
        if type(c) is StringColumn:
            start, stop = c.span(a, b)
            spans.append((start, stop))
            nbytes += stop - start
    buffer = alloc(nbytes)
    batch: dict[str, Any] = {}
    at, texts = layout.nbytes, iter(spans)
    for (name, column), spec in zip(columns.items(), layout.leaves):
        if type(column) is StringColumn:
            start, stop = next(texts)
            size = stop - start
            if size:
                buffer[at:at + size] = column.data[start:stop]
            batch[name] = size
            at += size
            continue
        view = np.ndarray(spec.shape, spec.dtype, buffer, spec.offset)  # (as leaf_views)
        if type(column) is Take:  # gathered straight into the slot: no copy in between
            column.array.take(column.indices[a:b], 0, view, "clip")  # (as Take.taken)
        else:
            view[...] = column[a:b]
        batch[name] = view
    return batch


def gathered_columns(gathered: dict[str, Any], size: int) -> tuple[tree_lib.TreeDef, list]:
    """Columns of a flat dict of ``size`` rows a column: arrays, ``Take``s (rows still to
    gather) or ``StringColumn``s (a source's ``gather_columns``)."""
    treedef = ("dict", tuple(gathered), (tree_lib.LEAF,) * len(gathered))
    columns = []
    for name, values in gathered.items():
        if type(values) is StringColumn:
            columns.append(_Column(f"[{name!r}]", (size,), _OBJECT, values))
        elif type(values) is Take:
            array = values.array
            columns.append(_Column(f"[{name!r}]", (size, *array.shape[1:]), array.dtype, values))
        else:
            columns.append(_Column(f"[{name!r}]", values.shape, values.dtype, values))
    return treedef, columns


def _stack(column: _Column, out: np.ndarray | None = None) -> np.ndarray:
    values = column.values
    if type(values) is StringColumn:
        return values.objects()
    if type(values) is Take:
        return values.taken(out)
    if type(values) is _TakeParts:
        if out is None:
            out = np.empty(column.shape, column.dtype)
        for array, rows, local in zip(values.arrays, values.rows, values.local):
            out[rows] = np.take(array, local, axis=0, mode="clip")
        return out
    if isinstance(values, np.ndarray):
        if out is None:
            return values
        out[...] = values
        return out
    if out is None:
        out = np.empty(column.shape, column.dtype)
    if len(column.shape) == 1:  # scalars: fromiter is an order of magnitude faster than np.stack
        out[:] = np.fromiter(values, column.dtype, count=len(values))
    elif column.shape[1] == 0 or column.dtype.hasobject:
        out[...] = np.stack(values)
    else:  # rows of equal shape: one concatenate along axis 0 straight into out
        try:
            np.concatenate(values, axis=0, out=out.reshape(-1, *column.shape[2:]), casting="no")
        except TypeError:  # a record's dtype differs from the first record's
            _raise_leaf_mismatch(column.path, values, column.positions)
    return out
