"""Batch layout and stacking of columns into a given buffer.

::

    records ─┐                       ┌─> Layout (treedef, per-leaf path/shape/dtype/offset)
             ├─ columns (one a leaf) ┤
    batch  ──┘  (record_columns.py)  └─> write into buffer (one copy) ─> NumPy views, zero copy

A *column* holds one leaf of the batch: the per-record values still to stack, an
already-batched array (from a vectorised ``__getitems__``), rows still to gather
(``DeferredTake``) or a ``StringColumn``; ``record_columns`` validates them before anything is written.

Numeric leaves go into one flat byte buffer, each at a 64-byte aligned offset. Anything with the
array protocol (a torch tensor, a PIL image, a ``jax.Array``) becomes a NumPy array; ``str`` and
``bytes`` stay Python objects (an object array, which cannot live in shared memory and travels
beside it); any other object is refused with the leaf's path and what to do.

Example:
    >>> from jaxloader.batching.record_columns import record_columns
    >>> records = [{"x": np.zeros(3, np.float32), "y": i} for i in range(4)]
    >>> batch, layout = materialize(*record_columns(records))
    >>> batch["x"].shape, batch["y"].tolist(), layout.nbytes
    ((4, 3), [0, 1, 2, 3], 128)
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import numpy as np

from jaxloader.base import tree as tree_lib
from jaxloader.base.columns import DeferredTake, take_rows
from jaxloader.base.errors import CollateError
from jaxloader.base.string_column import StringColumn, split
from jaxloader.batching.leaf_mismatch import raise_leaf_mismatch
from jaxloader.batching.record_columns import Column

_ALIGN = 64  # bytes: cache-line alignment of every leaf in a buffer
_OBJECT = np.dtype(object)


# A leaf's offset when it is not at a fixed place in the buffer: object leaves travel beside it;
# strings (or bytes) gathered as a ``StringColumn`` are written after the numbers, one leaf
# after another, and only their sizes in bytes travel beside the buffer, in the leaves' place
# (an int is cheaper to pickle than any object: ``jaxloader.base.string_column``).
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

    def views(self, buffer: Any, objects: list | None = None, copied: int = 0) -> Any:
        """The batch as NumPy arrays over ``buffer`` (no copy, but of those of ``copied`` bytes
        or fewer); object leaves from ``objects``, where the size in bytes stands for strings
        written into ``buffer`` after the numbers."""
        leaves = self.leaf_views(buffer, objects)
        if copied:
            leaves = [own_if_small(leaf, copied) for leaf in leaves]
        return tree_lib.unflatten(self.treedef, leaves)

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


def own_if_small(leaf: Any, most: int) -> Any:
    """``leaf`` copied where it is a NumPy array of ``most`` bytes or fewer (a view of a batch's
    slot kept holds the whole slot; a copy holds itself)."""
    return leaf.copy() if isinstance(leaf, np.ndarray) and leaf.nbytes <= most else leaf


def take_columns(treedef: tree_lib.TreeDef, arrays: list, indices: np.ndarray) -> tuple:
    """Columns gathering ``indices`` from each array, without an intermediate copy."""
    paths = tree_lib.leaf_paths(treedef)
    n = len(indices)
    return treedef, [Column(p, (n, *a.shape[1:]), a.dtype, DeferredTake(a, indices))
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
    return treedef, [Column(p, (n, *a.shape[1:]), a.dtype,
                             _TakeParts([arrays[i] for arrays in part_arrays], rows, local))
                     for i, (p, a) in enumerate(zip(paths, part_arrays[0]))]


def add_leaf(treedef: tree_lib.TreeDef, columns: list, key: str, array: np.ndarray,
             why: str = "last_batch='pad'") -> tuple:
    """Appends ``array`` as leaf ``key`` of a dict batch (used for the pad mask, which
    ``why`` adds)."""
    if treedef[0] != "dict":
        other = (", or use last_batch='partial' (one process: a short last batch, every "
                 "record kept) or 'drop'" if why.startswith("last_batch") else
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
    return tree_lib.with_leaf(treedef, key), [*columns, Column(f"[{key!r}]", array.shape,
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
    """Rows ``a`` to ``b`` of a task's gathered ``columns`` (a flat dict of arrays,
    ``DeferredTake``s and ``StringColumn``s, as ``gathered_columns`` takes them) written into ``alloc``, as
    ``materialize`` writes them, with ``layout`` computed once for the task's steps (all of
    one size; no leaf ``BESIDE``): no columns, layout or pytree made a step. A step's strings
    are copied from where the task's ``StringColumn`` holds them (``span``), no column made
    for them, by slice assignment (quicker than through ``np.frombuffer``)."""
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
        if type(column) is DeferredTake:  # gathered straight into the slot: no copy in between
            if column.array.flags.c_contiguous:  # (as DeferredTake.taken)
                column.array.take(column.indices[a:b], 0, view, "clip")
            else:
                take_rows(column.array, column.indices[a:b], view)
        else:
            view[...] = column[a:b]
        batch[name] = view
    return batch


def stack_rows(column: Column, a: int, b: int, out: np.ndarray) -> np.ndarray:
    """Rows ``a`` to ``b`` of a numeric ``column`` stacked into ``out`` (a ``JitMap``'s input,
    a chunk of rows at a time).

    Example:
        >>> c = Column("['x']", (4, 2), np.dtype(np.int64), [np.full(2, i) for i in range(4)])
        >>> stack_rows(c, 1, 3, np.empty((2, 2), np.int64)).tolist()
        [[1, 1], [2, 2]]
    """
    values = column.values
    if type(values) is _TakeParts:
        parts = [(r[(r >= a) & (r < b)] - a, loc[(r >= a) & (r < b)])
                 for r, loc in zip(values.rows, values.local)]
        values = _TakeParts(values.arrays, [r for r, _ in parts], [loc for _, loc in parts])
    elif type(values) is DeferredTake:
        values = values.rows(a, b)
    else:
        values = values[a:b]
    names = None if column.names is None else column.names[a:b]
    return _stack(Column(column.path, (b - a, *column.shape[1:]), column.dtype, values,
                         names), out)


def gathered_columns(gathered: dict[str, Any], size: int) -> tuple[tree_lib.TreeDef, list]:
    """Columns of a flat dict of ``size`` rows a column: arrays, ``DeferredTake``s (rows still to
    gather) or ``StringColumn``s (a source's ``gather_columns``)."""
    treedef = ("dict", tuple(gathered), (tree_lib.LEAF,) * len(gathered))
    columns = []
    for name, values in gathered.items():
        if type(values) is StringColumn:
            columns.append(Column(f"[{name!r}]", (size,), _OBJECT, values))
        elif type(values) is DeferredTake:
            array = values.array
            columns.append(Column(f"[{name!r}]", (size, *array.shape[1:]), array.dtype, values))
        else:
            columns.append(Column(f"[{name!r}]", values.shape, values.dtype, values))
    return treedef, columns


def _stack(column: Column, out: np.ndarray | None = None) -> np.ndarray:
    values = column.values
    if type(values) is StringColumn:
        return values.objects()
    if type(values) is DeferredTake:
        return values.taken(out)
    if type(values) is _TakeParts:
        if out is None:
            out = np.empty(column.shape, column.dtype)
        for array, rows, local in zip(values.arrays, values.rows, values.local):
            out[rows] = take_rows(array, local)
        return out
    if isinstance(values, np.ndarray):
        if out is None:  # (a batch in the training process, as a slot's: its own, writable)
            return values.copy() if column.borrowed or not values.flags.writeable else values
        out[...] = values
        return out
    if out is None:
        out = np.empty(column.shape, column.dtype)
    if len(column.shape) == 1:  # scalars: fromiter is an order of magnitude faster than np.stack
        out[:] = np.fromiter(values, column.dtype, count=len(values))
    elif 0 in column.shape[1:] or column.dtype.hasobject:  # (no values: (3, 0) rows)
        if not column.dtype.hasobject and any(v.dtype != column.dtype for v in values):
            raise_leaf_mismatch(column.path, values, column.names)  # (as rows with values)
        out[...] = np.stack(values)
    else:  # rows of equal shape: one concatenate along axis 0 straight into out
        try:
            np.concatenate(values, axis=0, out=out.reshape(-1, *column.shape[2:]), casting="no")
        except TypeError:  # a record's dtype differs from the first record's
            raise_leaf_mismatch(column.path, values, column.names)
    return out
