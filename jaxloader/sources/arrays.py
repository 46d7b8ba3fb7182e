"""``ArraySource``: in-memory arrays with the records along axis 0.

Example:
    >>> import numpy as np
    >>> src = ArraySource({"image": np.zeros((10, 28, 28), np.uint8), "label": np.arange(10)})
    >>> len(src), src[3]["label"], src.__getitems__(np.array([1, 2]))["image"].shape
    (10, np.int64(3), (2, 28, 28))
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxloader.base import tree as tree_lib
from jaxloader.base.checks import record_index
from jaxloader.base.errors import ConfigError, JaxloaderWarning, user_stacklevel
from jaxloader.base.loader_names import loader_names
from jaxloader.base.mapped_files import MappedFiles
from jaxloader.sources.protocol import Source
from jaxloader.sources.frames import (FRAME_AS_ONE, arrow_columns, arrow_kind, as_series,
                                     check_aligned, frame_columns, is_data_frame,
                                     one_kind_of_numbers)


@loader_names("source")
class ArraySource(Source):
    """A pytree (dict, tuple, list, namedtuple) of NumPy arrays with the records along axis 0,
    or a pandas or polars ``DataFrame`` or a pyarrow ``Table``: a dict of its columns, each of
    its own dtype (a record is a row, ``{"age": ..., "income": ...}``; ``ArraySource(
    df.to_numpy())`` for one array; a nullable column, ``Int64``, as its NumPy dtype, refused
    where a value is missing, as a time zone is). pandas leaves are paired by position, and
    so refused where their indexes differ. A masked
    array with masked values is refused: a batch would not carry its mask. A sequence that is
    not a list (a config's ``ListConfig``) is read as a list, a mapping as a dict.

    Records are read-only views of the arrays (also in worker processes): a transform copies
    what it changes. A memory-mapped file (``np.load(path, mmap_mode="r")``) changed in place
    since the source was made (cut: a read of it would kill the process with SIGBUS;
    rewritten: a batch would mix two versions) is refused at the next batch, naming it; a raw
    file that grew (appended to) is warned of; one mapped to be written (``mmap_mode="r+"``,
    a replay buffer) may change, not be cut.

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> src = jl.ArraySource((np.arange(6).reshape(3, 2), np.array([7, 8, 9])))
        >>> src[1]
        (array([2, 3]), np.int64(8))
    """

    reads_thread_safe = True  # (its reads take no lock: ``base.source_locks``)
    kind_known = True  # (``__getitems__([])``: its rows' keys, dtypes and shapes, no read)

    def __init__(self, tree: Any) -> None:
        if is_data_frame(tree):
            tree = frame_columns(tree)
        elif arrow_kind(tree) is not None:
            tree = arrow_columns(tree)
        leaves, self._treedef = tree_lib.flatten(_lists(tree))
        paths = tree_lib.leaf_paths(self._treedef)
        if not leaves:
            raise ConfigError("ArraySource(tree): expected at least one array leaf, got none")
        check_aligned(paths, leaves)
        arrays = []
        for path, leaf in zip(paths, leaves):
            given = type(leaf).__name__  # (as the user gave it: a Categorical, an Index)
            if arrow_kind(leaf) == "table":
                raise ConfigError(
                    f"ArraySource leaf {path}: an Arrow {type(leaf).__name__} inside the tree; "
                    "pass the table alone, ArraySource(table), for a dict of its columns a "
                    "record, or give its columns as leaves ({'x': table['x'], ...})")
            if arrow_kind(leaf) == "column":  # (np.asarray: a null as NaN, ints as floats)
                leaf = arrow_columns(leaf, path)
            leaf = as_series(leaf)  # (an Index, a Categorical: a Series' checks)
            if is_data_frame(leaf) and type(leaf).__name__ == "Series":
                leaf = frame_columns(leaf, f"ArraySource leaf {path}")  # (as alone: its
                # dtype's values, nulls refused)
            elif is_data_frame(leaf) and one_kind_of_numbers(leaf):
                leaf = leaf.to_numpy()  # (a model's X of one dtype: a matrix loses nothing)
            elif is_data_frame(leaf):  # (np.asarray: one matrix of one dtype, names lost)
                raise ConfigError(
                    f"ArraySource leaf {path}: a {type(leaf).__name__} inside the tree, "
                    f"{FRAME_AS_ONE}; pass the frame alone, "
                    "ArraySource(df), for a dict of its columns a record, or give its columns "
                    "as arrays yourself (df.to_numpy(dtype) for one matrix)")
            if np.ma.is_masked(leaf):  # (its data alone would be batched: the mask lost)
                raise ConfigError(
                    f"ArraySource leaf {path}: a masked array with {np.ma.count_masked(leaf)} "
                    "masked value(s), whose mask a batch would not carry; fill them "
                    "(x.filled(0)) and pass the mask as a leaf of its own (np.ma.getmaskarray(x))")
            array = leaf if isinstance(leaf, np.ndarray) and not isinstance(
                leaf, np.ma.MaskedArray) else np.asarray(leaf)  # (a memmap stays one)
            if array.ndim == 0 or array.dtype.hasobject:
                strings = array.ndim > 0 and array.size and isinstance(array.flat[0], (str, bytes))
                in_a_list = path.endswith("]") and path.rsplit("[", 1)[1][:-1].isdigit()
                remedy = ("a Hugging Face dataset is read as it is: pass it to the DataLoader "
                          "(or to ConcatSource, jaxloader.mix), not to ArraySource"
                          if type(leaf).__module__.startswith("datasets.") else
                          "for strings, np.asarray(leaf, dtype=str) (fixed width: shared with "
                          "the workers, batched as <U arrays), or pass a list of records "
                          "({'text': ..., ...}: str leaves)" if strings else
                          "a list is a node of the tree, each item a leaf: pass a column of "
                          "values as np.asarray(values)" if in_a_list and array.ndim == 0 else
                          "wrap scalars in an array, keep other objects in your own source "
                          "(any object with __len__ and __getitem__)")
                raise ConfigError(
                    f"ArraySource leaf {path}: expected a NumPy array of numbers or fixed-width "
                    f"strings with records along axis 0, got {given} with shape "
                    f"{array.shape} dtype {array.dtype}; {remedy}"
                )
            arrays.append(array)
        lengths = {path: a.shape[0] for path, a in zip(paths, arrays)}
        if len(set(lengths.values())) != 1:
            listed = any(path.endswith("]") and path.rsplit("[", 1)[1][:-1].isdigit()
                         for path in lengths)  # (a list's items: leaves of their own)
            raise ConfigError(
                "ArraySource: every leaf must have the same number of records (axis 0), got "
                + ", ".join(f"{p}: {n}" for p, n in lengths.items())
                + "; slice the arrays to one length" + (
                    "; a list of arrays is a node of the tree, each array a leaf whose rows "
                    "are records: for a record an array (a volume a case), stack them "
                    "(np.stack(volumes)) or pass a list of records ([{'image': v} for v in "
                    "volumes])" if listed else ""))
        self._len = arrays[0].shape[0]
        _warn_of_lists_of_records(tree, self._len)
        self._mapped = MappedFiles("ArraySource", arrays)
        self._set_arrays(arrays)

    def _set_arrays(self, arrays: list[np.ndarray]) -> None:
        # Read-only views, here and in every worker: a transform that writes into a record
        # fails the same way with any number of workers, and never changes your arrays.
        self._arrays = [_read_only(a) for a in arrays]
        flat = tree_lib.is_flat_dict(self._treedef)
        self._items = list(zip(self._treedef[1], self._arrays)) if flat else None

    def __getstate__(self) -> dict:
        return {"treedef": self._treedef, "arrays": self._arrays, "len": self._len,
                "mapped": self._mapped}

    def __setstate__(self, state: dict) -> None:
        self._treedef, self._len = state["treedef"], state["len"]
        self._mapped = state.get("mapped") or MappedFiles("ArraySource")
        if "stamps" in state:  # (pickled before MappedFiles: its stamps kept)
            self._mapped.stamps = [(path, (*stamp, False)) for path, stamp in state["stamps"]]
        self._set_arrays(state["arrays"])  # small arrays arrive as writable copies

    @property
    def treedef(self) -> tree_lib.TreeDef:
        """The structure of one record."""
        return self._treedef

    @property
    def arrays(self) -> list[np.ndarray]:
        """The leaves, in treedef order (what a batch is gathered from: a memory-mapped file
        changed in place since is refused here)."""
        self._mapped.watch(soon=True)  # (a file cut since, read, ends the process by SIGBUS,
        # with no word: a loader's batch maker stats each file before each batch, and read
        # apart from it, at most every 10 ms: a second stat a batch cost small batches 10%)
        return self._arrays

    def __len__(self) -> int:
        return self._len

    def check_mapped(self, soon: bool = False) -> None:
        """Refuses a memory-mapped array's file changed in place since the source was made,
        as ``RaggedSource.check_mapped`` does: before each batch a loader makes of it, records
        read one by one (under a ``Map``) too; ``soon``: at most every 10 ms (a record read
        outside a loader)."""
        self._mapped.watch(soon)

    def __getitem__(self, index: int) -> Any:
        if self._mapped.stamps:
            self._mapped.soon()
        if type(index) is not int and not isinstance(index, (slice, list)) and not (
                isinstance(index, np.ndarray) and index.ndim):  # (rows at once: NumPy's)
            # True read every record, under one more axis; a float raised NumPy's error
            index = record_index(index, self._len, "ArraySource")
        try:
            if self._items is not None:  # fast path for the common flat dict
                return {k: a[index] for k, a in self._items}
            return tree_lib.unflatten(self._treedef, [a[index] for a in self._arrays])
        except IndexError:  # (NumPy's names no source, nor its range)
            if isinstance(index, (int, np.integer)):
                record_index(index, self._len, "ArraySource")
            else:  # (rows at once: the first out of range, as a batched read names it)
                rows = np.asarray(index).ravel()
                bad = rows[(rows < -self._len) | (rows >= self._len)] if rows.dtype.kind in \
                    "iu" else rows[:0]
                if len(bad):
                    raise IndexError(f"ArraySource: index {bad[0]} out of range [-{self._len}, "
                                     f"{self._len})") from None
            raise

    def __getitems__(self, indices: np.ndarray) -> Any:
        """A batched pytree of the records at ``indices`` (one gather per leaf)."""
        indices = np.asarray(indices) if len(indices) else np.zeros(0, np.intp)  # ([]: floats)
        if indices.dtype.kind not in "iu":  # (a mask's bools: records 0 and 1; floats: refused)
            raise TypeError(f"ArraySource.__getitems__: expected an array of record numbers, got "
                            f"dtype {indices.dtype}" + ("; for a mask, pass np.flatnonzero(mask)"
                                                        if indices.dtype == bool else ""))
        try:
            return tree_lib.unflatten(self._treedef, [  # (take copies a strided view whole)
                a.take(indices, axis=0) if a.flags.c_contiguous else a[indices]
                for a in self.arrays])
        except IndexError:  # (NumPy's names no source)
            raise IndexError(f"ArraySource.__getitems__: record numbers in [0, {self._len}) "
                             f"expected, got {indices.min()} to {indices.max()}") from None

    def __repr__(self) -> str:
        paths = tree_lib.leaf_paths(self._treedef)  # (a leaf named: ['image'] (10, 4) uint8)
        leaves = ", ".join(("" if path == "<root>" else f"{path} ") + f"{a.shape} {a.dtype}"
                           for path, a in zip(paths, self._arrays))
        return f"ArraySource({self._len} records; {leaves})"


def _read_only(array: np.ndarray) -> np.ndarray:
    """A read-only plain ``ndarray`` view: a subclass (a ``recarray``, ``matrix``, ``memmap``)
    reached a batch in process only (workers send plain arrays), and was pickled whole to each
    worker, where a plain view of a memory-mapped file is mapped by its file."""
    view = array.view(np.ndarray)
    view.flags.writeable = False
    return view


def _lists(tree: Any) -> Any:
    """``tree`` with its sequences of arrays (or trees) that are not a list or tuple (a
    config's list: OmegaConf's ``ListConfig``, a ``UserList``) made lists, as a mapping that
    is not a dict is read as one: taken as leaves, ``[features, labels]`` was stacked into one
    array of 2 records (the int labels made float64) where a list is two columns. A tree
    without one is ``tree`` itself."""
    if isinstance(tree, Mapping):
        values = {k: _lists(v) for k, v in tree.items()}
        if all(values[k] is v for k, v in tree.items()):
            return tree
        return (collections.defaultdict(tree.default_factory, values) if isinstance(
            tree, collections.defaultdict) else collections.OrderedDict(values) if isinstance(
                tree, collections.OrderedDict) else values)  # (its kind of tree kept)
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        items = [_lists(c) for c in tree]
        changed = any(a is not b for a, b in zip(items, tree))
        return (items if isinstance(tree, list) else tuple(items)) if changed else tree
    if isinstance(tree, Sequence) and not isinstance(tree, (str, bytes, tuple)) and any(
            isinstance(c, (np.ndarray, Mapping)) or isinstance(c, Sequence) and not isinstance(
                c, (str, bytes)) for c in tree):  # (one of numbers or text is a column, as
        return [_lists(c) for c in tree]  # before: an array.array, a deque, a UserList)
    return tree


def _warn_of_lists_of_records(tree: Any, n: int, where: str = "the tree") -> None:
    """Warns of a list (or tuple) of more arrays of 2 dimensions or more (16 or more) than each
    has rows: 1,000 images in a list are 1,000 leaves whose 64 rows are the records, 64
    records of 1,000 leaves each, not 1,000 records; a list of columns (1-D: ``(X, y)``, 20
    sensors) is meant as it reads."""
    def under(key: Any) -> str:
        return f"{'' if where == 'the tree' else where}[{key!r}]"
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            _warn_of_lists_of_records(value, n, under(key))
        return
    if not isinstance(tree, (list, tuple)) or hasattr(tree, "_fields"):
        return
    shapes = [getattr(item, "shape", ()) for item in tree]
    if len(tree) >= 16 and len(tree) > n and all(len(shape) >= 2 for shape in shapes):
        warnings.warn(  # (warned, not refused: a list of a few rows' columns is read as before)
            f"ArraySource: {where} is a list of {len(tree):,} arrays (the first of shape "
            f"{shapes[0]}), each a leaf whose {n:,} rows are the records: {n:,} records of "
            f"{len(tree):,} leaves each; for {len(tree):,} records, one array each, stack them "
            "(np.stack(arrays)) or pass a list of records ([{'image': a} for a in arrays]) to "
            "a loader; for columns, name them in a dict ({'f0': a, ...}) to say so",
            JaxloaderWarning, stacklevel=user_stacklevel())
        return
    for i, item in enumerate(tree):
        _warn_of_lists_of_records(item, n, under(i))
