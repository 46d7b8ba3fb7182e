"""The source protocol: anything with ``__len__`` and ``__getitem__``.

A source maps an index in ``[0, len)`` to a record (a pytree of arrays and scalars). Hugging Face
datasets, Grain sources and PyTorch map-style datasets are sources by duck typing. A source may
also offer ``__getitems__(indices)`` for a vectorised read of many records at once; it returns
either a ``list`` of records (PyTorch's and Hugging Face's convention) or an already batched
pytree (any other container) whose leaves have ``len(indices)`` rows. The loader uses it when no
per-record transform needs single records. A source may give a ``fingerprint`` (a str) that
changes when its data does (``jaxloader.sources.fingerprint``).

Example:
    >>> check_source([{"x": 1}, {"x": 2}])
    2
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxloader.base.batch_rows import split_rows
from jaxloader.base.errors import ConfigError, RecordError
from jaxloader.base.read_threads import each
from jaxloader.sources.frames import arrow_kind, is_data_frame
from jaxloader.sources.protocol import Source


def check_source(source: Any) -> int:
    """Checks the source protocol; returns ``len(source)``."""
    if isinstance(source, Mapping):
        keys = list(source)[:4]
        splits = keys and all(  # a DatasetDict: datasets by split, not arrays or lists
            isinstance(source[k], Source) and not isinstance(source[k], (list, tuple, str,
                                                                         Mapping))
            and not hasattr(source[k], "dtype") for k in keys)
        records = keys and all(isinstance(source[k], Mapping) for k in keys)  # (by index)
        streams = keys and all(  # an IterableDatasetDict: streams by split
            type(source[k]).__name__ == "IterableDataset" for k in keys)
        remedy = (f"pass one of them: source[{keys[0]!r}]" if splits else
                  "for records keyed by their index, pass a list of them in order: "
                  "[your_dict[k] for k in sorted(your_dict)]" if records else
                  f"pass one of them to a StreamLoader: jaxloader.StreamLoader("
                  f"source[{keys[0]!r}], ...)" if streams else
                  "for arrays with the records along axis 0, wrap it: "
                  "jaxloader.ArraySource(your_dict)")
        raise ConfigError(
            f"source: got a {type(source).__name__} of {len(source)} entries "
            f"({', '.join(map(repr, keys))}), which would be read as "
            f"{len(source)} records; {remedy}"
        )
    if arrow_kind(source) == "table":  # (its [i] is column i)
        raise ConfigError(
            f"source: got an Arrow {type(source).__name__} of {source.num_rows} rows, whose [i] "
            "is its column i, not the record of row i; wrap it: jaxloader.ArraySource(table) "
            "(a record is a row, a dict of the columns)")
    if is_data_frame(source) and not (type(source).__module__.startswith("polars") and type(
            source).__name__ == "Series"):  # (a polars Series' [i] is its value i: a source)
        kind = type(source).__name__
        raise ConfigError(
            f"source: got a {type(source).__module__.split('.')[0]} {kind} of {len(source)} "
            "rows, whose [i] is not the record of row i (pandas: a label, a column or a row; "
            "polars: a frame of one row, its columns' dtypes lost in a batch); wrap it: "
            f"jaxloader.ArraySource(your_{kind.lower()}) "
            + ("(a record is a row, a dict of the columns)" if kind == "DataFrame" else
               "(a record is a value)")
        )
    if _columns(source):
        shapes = ", ".join(str(tuple(a.shape)) for a in source)
        raise ConfigError(
            f"source: got a tuple of {len(source)} arrays of shapes {shapes}, "
            f"which would be read as {len(source)} records (each a whole array); for their "
            f"{len(source[0])} rows as records ((x[i], y[i]), as tf.data's from_tensor_slices "
            "reads them), wrap it: jaxloader.ArraySource(your_tuple) (for whole arrays as "
            "records, pass a list of them)"
        )
    if isinstance(source, (str, bytes, os.PathLike)):  # (has len and [i]: its characters)
        chars = "" if isinstance(source, os.PathLike) else (
            f", which would be read as {len(source)} records, one a character")
        raise ConfigError(
            f"source: got a {type(source).__name__} ({source!r:.80}), a path{chars}; read "
            "the files it names with a source: jaxloader.ParquetSource(path), "
            "ArrayRecordSource(paths), FileListSource(paths) (each file's bytes, decoded by a "
            "Map), or jaxloader.Stream.jsonl(paths)/.tar(paths) for a StreamLoader")
    if not isinstance(source, Source):
        remedy = "wrap NumPy arrays as ArraySource(arrays)"
        from jaxloader.streams.contract import ReadableStream
        from jaxloader.streams.huggingface import is_iterable_dataset

        if isinstance(source, ReadableStream):  # (given to PackedSource, MapSource, ...)
            remedy = ("a jaxloader stream, which has no random access: read it with "
                      "jaxloader.StreamLoader; pack its tokens with jaxloader.PackedStream"
                      "(stream, key, length), transform it with stream.map(fn)/.filter(fn)")
        elif is_iterable_dataset(source):
            remedy = ("a Hugging Face IterableDataset is a stream: jaxloader.StreamLoader(ds) "
                      "reads it as it is (docs/guides/streams.md), or pass the Dataset itself "
                      "(random access, without streaming=True)")
        elif hasattr(source, "shape") and hasattr(source, "__getitem__"):  # (a zarr array)
            remedy = ("an array of a store (zarr, HDF5): a source of your own reading its rows "
                      "(__len__: shape[0]; __getitem__ and __getitems__ reading them), as "
                      "docs/files.md shows; ArraySource(array) reads it whole into memory")
        elif _is_grain(source) and hasattr(source, "__iter__"):
            remedy = ("a Grain IterDataset (.to_iter_dataset(), .mp_prefetch()) reads in order: "
                      "pass the MapDataset before .to_iter_dataset() (random access: a new "
                      "shuffle each epoch, a restore in O(1)), with num_workers= and prefetch= "
                      "for mp_prefetch's (docs/migrating/grain.md)")
        elif hasattr(source, "__getitem__") and not hasattr(source, "__len__") and not \
                hasattr(source, "__iter__"):  # (a torch IterableDataset: a stream, below)
            remedy = ("add __len__ to the class, the number of records (a PyTorch "
                      "torch.utils.data.Dataset does not define one: its subclasses do)")
        elif hasattr(source, "__iter__"):
            remedy = ("an iterable without random access (a generator) is a stream: "
                      "jaxloader.StreamLoader(jaxloader.Stream.from_generator(make, shards=n)), "
                      "shard i read by make(i) (docs/guides/streams.md); or " + remedy)
        raise ConfigError(
            f"source: expected an object with __len__ and __getitem__ (a random-access source), "
            f"got {type(source).__name__}; {remedy}"
        )
    _grain_steps(source)
    try:
        n = len(source)
    except (TypeError, ValueError, OverflowError) as e:  # (a __len__ of 8.0, -1, 2**64)
        raise ConfigError(
            f"source: {type(source).__name__}.__len__ must return an int >= 0 (Python's len() "
            f"says: {e}); return the number of records as an int") from None
    if n <= 0:
        raise ConfigError(
            f"source: expected at least one record, got an empty source ({type(source).__name__} "
            "of length 0); check the path or the split you loaded"
        )
    return n


_GRAIN_STEPS = {  # a Grain MapDataset's step -> what a loader takes for it
    "ShuffleMapDataset": (".shuffle(seed)", "shuffle=True and seed=: a new order each epoch, "
                          "where the dataset's is one order read in every epoch"),
    "RepeatMapDataset": (".repeat()", "num_epochs= (None: endless)"),
    "WindowShuffleMapDataset": ("WindowShuffleMapDataset(...)", "shuffle=jaxloader.LocalShuffle("
                                "window=8): blocks in a new order each epoch, where the "
                                "dataset's is one order read in every epoch"),
    "FlatMapMapDataset": ("FlatMapMapDataset(...)", "a Map returning a record's examples stacked (a "
                          "(k, ...) leaf), or a source of the split records: the dataset "
                          "holds a None in each slot past a record's examples"),
    "FilterMapDataset": (".filter(fn)", "jaxloader.FilteredSource(dataset, fn): the records "
                         "kept, where the dataset holds a None in place of each dropped"),
    "BatchMapDataset": (".batch(n)", "batch_size=n: the loader batches (a batch of the "
                        "dataset's batches otherwise)"),
    "RandomMapMapDataset": (".random_map(fn, seed)", "transforms=[fn] (a Grain RandomMap as it "
                            "is, or jaxloader.RandomMap): new draws each epoch, where the "
                            "dataset's are keyed by the record's index alone, the same draws in "
                            "every epoch"),
}


def _is_grain(obj: Any) -> bool:
    """Whether ``obj`` is one of Grain's (told by its class's module: Grain is not imported)."""
    return type(obj).__module__.split(".")[0] == "grain"


def _grain_steps(source: Any) -> None:
    """Refuses a Grain ``MapDataset`` made with a step a loader takes itself (``.shuffle``,
    ``.repeat``, ``.filter``, ``.batch``, ``.random_map``), anywhere in its chain: each read as
    it is lost its meaning without a word (one order every epoch, a dropped record a None,
    batches of batches, one draw a record for every epoch)."""
    todo, looked = [source], 0
    while todo and looked < 1024:
        dataset, looked = todo.pop(), looked + 1
        if not _is_grain(dataset):
            continue
        step = _GRAIN_STEPS.get("RandomMapMapDataset" if getattr(  # (.map of a RandomMap, or
            dataset, "_rng_pool", None) is not None else type(dataset).__name__)  # of a seed)
        if step is not None:
            raise ConfigError(
                f"source: a Grain {type(source).__name__} made with {step[0]}" + (
                    f" (a {type(dataset).__name__} in its chain)" if dataset is not source
                    else "") + ", which the loader does itself; pass "
                f"the dataset before {step[0]} and use {step[1]} (docs/migrating/grain.md)")
        try:
            todo += list(dataset.parents)
        except Exception:  # noqa: BLE001 - (a Grain of another version: not looked into)
            pass


def _columns(source: Any) -> bool:
    """Whether ``source`` is a tuple of arrays that are columns, not records: a few arrays
    with one number of rows (``(x, y)``, as tf.data's ``from_tensor_slices`` takes them; of one
    shape too, inputs and targets of a language model). A list is left as records: images of
    one height and several widths, or whole arrays meant as records."""
    if not isinstance(source, tuple) or not 2 <= len(source) <= 64:
        return False
    shapes: list[Any] = [getattr(a, "shape", None) for a in source]
    if not all(isinstance(shape, tuple) and shape for shape in shapes):
        return False
    return len({shape[0] for shape in shapes}) == 1


def records_at(source: Any, indices: np.ndarray) -> list:
    """``source``'s records ``indices``, as a list: one ``__getitems__`` when it has one (a
    batched pytree is split into records) and its records are not ``large_views``, else one
    ``source[i]`` each.

    Example:
        >>> records_at([{"x": 1}, {"x": 2}, {"x": 3}], np.array([2, 0]))
        [{'x': 3}, {'x': 1}]
    """
    if hasattr(source, "__getitems__") and not large_views(source):
        got = source.__getitems__(indices)
        if isinstance(got, list):
            return one_each(got, len(indices))
        return split_rows(got, len(indices))
    return each(source.__getitem__, np.asarray(indices).tolist())


def one_each(records: list, n: int, where: str = "source") -> list:
    """``records``, the list a ``__getitems__`` returned for ``n`` indices, checked to hold one
    record an index: a list cut short (a record it could not decode left out) would make a
    smaller batch, or shift every record after it, without a word.

    Example:
        >>> one_each([{"x": 1}], 2)
        Traceback (most recent call last):
        ...
        jaxloader.base.errors.RecordError: source.__getitems__ returned 1 records for 2 indices: ...
    """
    if len(records) != n:
        raise RecordError(
            f"{where}.__getitems__ returned {len(records)} records for {n} indices: expected "
            "one record an index, in their order; to leave records out, use a FilteredSource "
            "(a Filter is a stream's)")
    return records


_VIEWS_FROM = 256 << 10  # bytes a record: past them, an array source's records are read as views
_VIEWS: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def large_views(source: Any) -> bool:
    """Whether ``source`` is an ``ArraySource``, or jaxloader's wrappers (``FilteredSource``,
    ``MapSource``, ``ConcatSource``, a mixture) over them, whose records hold ``_VIEWS_FROM``
    bytes or more (volumes, long clips): read one by one, each a view of its arrays; a batched
    read (``__getitems__``) copied whole records before a transform cut a patch of each (a
    batch of 4 patches of 32**3 copied four 64 MiB volumes), or a filter looked at one voxel
    of each. Asked once a source."""
    try:
        return _VIEWS[source]
    except (KeyError, TypeError):
        pass
    from jaxloader.base.abilities import parts_of
    from jaxloader.sources.arrays import ArraySource
    from jaxloader.sources.parts import walk

    large, found = True, False
    for part in walk(source):
        if isinstance(part, ArraySource):
            found = True
            large = large and sum(a.nbytes // max(1, len(a)) for a in part.arrays) >= _VIEWS_FROM
        elif (not type(part).__module__.startswith("jaxloader.") or not parts_of(part)
              or getattr(part, "batched", False)):
            large = False  # (a source of the user's, or a file's: its own batched read; a
            # MapSource(batched=True)'s function is the user's vectorised one, a batch a call)
        if not large:
            break
    views = large and found
    try:
        _VIEWS[source] = views
    except TypeError:  # (a list, which takes no weak reference)
        pass
    return views
