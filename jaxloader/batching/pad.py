"""``Pad``: leaves of other lengths padded to their batch's longest, with their lengths.

::

    records (after the record transforms) ──Pad: each named leaf padded on its first axis to
    the batch's longest (rounded up to multiple_of), its length a leaf beside──> collation

A batch's leaf has one shape, so records of other lengths (clips, sentences, feature frames)
are padded before they are stacked; padding each record to one fixed length wastes what the
batch's longest does not need. The padded length is a pure function of the batch's records, so
a batch is the same with any worker count and after a restore. Rounding up to ``multiple_of``
bounds the shapes a jitted step is compiled for (a few buckets, not one a length).

Example:
    >>> import numpy as np
    >>> pad = Pad("tokens", multiple_of=4)
    >>> records = [{"tokens": np.arange(3)}, {"tokens": np.arange(5)}]
    >>> padded = pad_records(pad, records)
    >>> [r["tokens"].tolist() for r in padded], [int(r["tokens_length"]) for r in padded]
    ([[0, 1, 2, 0, 0, 0, 0, 0], [0, 1, 2, 3, 4, 0, 0, 0]], [3, 5])
"""

from __future__ import annotations

import collections
from typing import Any, Mapping, Sequence

import numpy as np

from jaxloader.base import tree as tree_lib
from jaxloader.base.checks import Int, check_int
from jaxloader.base.loader_names import loader_names
from jaxloader.base.number_kinds import cast_kept, finfo_of, held_as, ml_number, number_kind
from jaxloader.base.errors import CollateError, ConfigError

_INT32_MAX = (1 << 31) - 1


@loader_names("transform")
class Pad:
    """Pads the leaves ``keys`` of each batch's records on their first axis to the batch's
    longest (rounded up to ``multiple_of``) with ``value``, and adds each record's length as the
    leaf ``key + length_suffix`` (an ``int32``; ``length_suffix=None``: none). Records must be
    dicts. It goes in ``transforms=`` after the record transforms (``Map``, ``RandomMap``) and
    before the batch transforms (``BatchMap``, ``JitMap``), which then see the padded batch.

    Args:
        keys: a key of the records, or several.
        value: what pads (cast to each leaf's dtype; ``np.datetime64("NaT", "s")`` for times), or a
            dict of one for each key (``{"audio": 0.0, "ids": -1}``).
        multiple_of: the padded length is a multiple of it (1: the batch's longest), or a dict
            of one for each key.
        length: pad every batch to this length instead (a record longer is refused): what
            several processes reading one global batch need, each padding its own rows; or a
            dict of one for each key (a graph's budgets: ``{"nodes": 64, "edges": 256}``;
            ``None`` for a key padded to the longest).
        length_suffix: the lengths leaf's name after its key's.
        dtype: each padded leaf's dtype, or a dict of one for some keys (``{"ids": np.int32}``):
            lists are made arrays of it and arrays cast to it (where it holds their kind).
            Without it, a leaf keeps its records' dtype; an empty Python list (``float64``
            for NumPy) takes the others', so a batch whose records all hold empty lists is
            ``float64``: give ``dtype=`` for lists that may all be empty (token ids). An
            empty leaf takes the trailing shape of the batch's records with rows too (a
            graph's ``[]`` of edges; a batch of none keeps its own, refused where that says
            no shape of its rows: ``(0, 0)``).

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> clips = [{"audio": np.ones(n, np.float32), "label": n % 2} for n in (3, 7, 5, 2)]
        >>> loader = jl.DataLoader(clips, batch_size=2, transforms=[jl.Pad("audio")])
        >>> [(b["audio"].shape, b["audio_length"].tolist()) for b in loader]
        [((2, 7), [3, 7]), ((2, 5), [5, 2])]
    """

    def __init__(self, keys: str | Sequence[str], *, value: Any = 0,
                 multiple_of: Int | Mapping[str, Int] = 1,
                 length: Int | Mapping[str, Int] | None = None,
                 length_suffix: str | None = "_length", dtype: Any = None) -> None:
        named = [keys] if isinstance(keys, str) else list(keys) if isinstance(
            keys, Sequence) and not isinstance(keys, bytes) else None  # (a config's ListConfig
        value, multiple_of, length, dtype = (  # and DictConfig: a list's and a dict's)
            _dict(value), _dict(multiple_of), _dict(length), _dict(dtype))
        if not named or not all(isinstance(k, str) for k in named):
            raise ConfigError(f"Pad(keys): expected a key of the records (a str) or a list of "
                              f"them, got {keys!r:.80}")
        if len(set(named)) < len(named):
            raise ConfigError(f"Pad(keys): {named} names a key twice")
        said = isinstance(length_suffix, str) and length_suffix.lower() in ("none", "null")
        if length_suffix is not None and (not isinstance(length_suffix, str) or
                                          not length_suffix or said):  # ("None": key tNone)
            raise ConfigError(f"Pad(length_suffix): expected a non-empty str or None, got "
                              f"{length_suffix!r}" + "; a YAML file's None is null (its 'None' "
                              "is a str)" * said)
        values = value if isinstance(value, dict) else dict.fromkeys(named, value)
        if set(values) != set(named):
            raise ConfigError(f"Pad(value): a dict gives the value of each key of {named}, got "
                              f"one for {list(values)}")
        for given in values.values():
            if not isinstance(given, (int, float, complex, np.number, np.bool_, np.datetime64,
                                      np.timedelta64)) and not ml_number(given):
                raise ConfigError(f"Pad(value): expected a number (what pads), or a dict of one "
                                  f"for each key, got {given!r:.80}")
        try:
            kinds = {k: np.dtype(d) for k, d in (dtype.items() if isinstance(dtype, dict) else
                                                 dict.fromkeys(named, dtype).items())
                     if d is not None}
        except TypeError as e:
            raise ConfigError(f"Pad(dtype): expected a NumPy dtype (np.int32), or a dict of one "
                              f"for some keys, got {dtype!r:.80}: {e}") from e
        if set(kinds) - set(named) or any(number_kind(d) not in "biufcmM" for d in kinds.values()):
            raise ConfigError(f"Pad(dtype): expected a numeric dtype for keys of {named}, got "
                              f"{dtype!r:.80}")
        self.dtypes = kinds
        for key, kind in kinds.items():  # (both known now: refused here, not at a batch;
            held, kept = held_as(values[key], kind)  # a time's remedy is said there)
            if not kept and number_kind(kind) in "biufc":
                raise ConfigError(f"Pad: {key!r} is made {kind} (dtype=), which cannot hold "
                                  f"value={values[key]!r} (it would be "
                                  f"{np.asarray(held).item()!r}); pass a value of its kind, "
                                  "or another dtype")
        self.keys = tuple(named)
        self.value = value
        self.values = values  # (each key's)
        self.multiples = {k: check_int(f"Pad(multiple_of) of {k!r}", m, low=1, remedy="1 (the "
                                       "batch's longest) or a bucket, e.g. 64")
                          for k, m in _each(named, multiple_of, "multiple_of").items()}
        self.lengths = {k: None if n is None else check_int(
            f"Pad(length) of {k!r}", n, low=1, high=_INT32_MAX,  # (the lengths leaf's dtype)
            remedy="the length every batch is padded to, an int32 as its lengths leaf is")
            for k, n in _each(named, length, "length").items()}
        self.multiple_of, self.length = multiple_of, length  # (as given: its repr's)
        if any(self.lengths[k] is not None and self.multiples[k] != 1 for k in named) and (
                isinstance(multiple_of, dict) or not isinstance(length, dict) or None not in
                self.lengths.values()):  # (an int with lengths for some keys: the keys padded
            # to their longest round to it; with one for every key, it rounds none)
            raise ConfigError(f"Pad: got length={length} and multiple_of={multiple_of}; a "
                              "fixed length pads every batch to it: pass one of the two (for "
                              "a key)")
        self.length_suffix = length_suffix
        self.fn = pad_records  # (what a state's digest of the transforms reads: its code)

    @property
    def settings(self) -> str:
        """What changes the batches it makes (a state names it)."""
        return repr(self)

    def __repr__(self) -> str:
        keys = self.keys[0] if len(self.keys) == 1 else list(self.keys)
        size = ", ".join([f"multiple_of={_in_order(self.multiple_of, self.keys)}"] * (
            self.length is None or self.multiple_of != 1) + [
            f"length={_in_order(self.length, self.keys)}"] * (self.length is not None))
        value = ({key: self.values[key] for key in self.keys} if isinstance(self.value, dict)
                 else self.value)  # (a dict in the keys' order: the same Pad, the same text)
        kinds = "" if not self.dtypes else ", dtype=" + (
            _dtype_text(self.dtypes[self.keys[0]]) if len(self.keys) == 1 else "{" + ", ".join(
                f"{k!r}: {_dtype_text(self.dtypes[k])}" for k in self.keys if k in self.dtypes)
            + "}")  # (in the keys' order: the same Pad, the same text)
        return (f"Pad({keys!r}, value={value!r}, {size}, length_suffix={self.length_suffix!r}"
                f"{kinds})")


def split_pad(batch_transforms: tuple) -> tuple[Pad | None, tuple]:
    """A loader's batch transforms as its ``Pad`` (first where there is one: ``transforms``'
    order) and those that run on the collated batch."""
    if batch_transforms and isinstance(batch_transforms[0], Pad):
        return batch_transforms[0], batch_transforms[1:]
    return None, batch_transforms


def pad_records(pad: Pad, records: list, names: Any = None) -> list:
    """``records`` with ``pad.keys`` padded to their longest and their lengths added (new
    dicts; the records given are left as they are). ``names`` names a record in errors."""
    out = [_fields(pad, record, names, j) for j, record in enumerate(records)]
    for key in pad.keys:
        leaves, first = _shaped_empties([record[key] for record in out])
        if not any(len(leaf) for leaf in leaves) and 0 in leaves[0].shape[1:]:
            raise CollateError(
                f"{pad!r}: every record's {key!r} in this batch is empty, of shape "
                f"{leaves[0].shape}, which says no shape of its rows (a Parquet row group of "
                "empty lists of lists); padded, the batch would have an axis of 0 where "
                "others have the rows' size: write such lists of a fixed size "
                "(pa.list_(pa.float32(), 4)), or give them their rows' shape in a Map before "
                "the Pad (np.reshape(x, (-1, 4))); rows meant to hold no values: leave the key "
                "out of the Pad")
        for j, leaf in enumerate(leaves):
            if leaf.shape[1:] != leaves[first].shape[1:]:
                raise CollateError(
                    f"{pad!r}: {key!r} of {tree_lib.record_name(names, j)} has shape "
                    f"{leaf.shape} and of {tree_lib.record_name(names, first)} "
                    f"{leaves[first].shape}: "
                    "a Pad pads the first axis only, the others must agree; pad or crop "
                    "those in a Map before it")
        longest = max(len(leaf) for leaf in leaves)
        fixed, multiple = pad.lengths[key], pad.multiples[key]
        width = -(-longest // multiple) * multiple if fixed is None else fixed
        if longest > width:
            j = next(j for j, leaf in enumerate(leaves) if len(leaf) > width)
            raise CollateError(f"{pad!r}: {key!r} of {tree_lib.record_name(names, j)} has "
                               f"{longest} rows, more than length={width}; crop it in a Map "
                               "before the Pad, or pass a larger length=")
        kind = pad.dtypes.get(key) or _kind(pad, key, leaves, names)
        _check_value(pad, key, kind)
        for record, leaf in zip(out, leaves):
            if len(leaf) != width or leaf.dtype != kind or leaf is not record[key]:
                padded = np.full((width, *leaf.shape[1:]), pad.values[key], dtype=kind)
                padded[:len(leaf)] = leaf
                record[key] = padded
            if pad.length_suffix is not None:
                record[key + pad.length_suffix] = np.int32(len(leaf))
    return out


def _shaped_empties(leaves: list[np.ndarray]) -> tuple[list[np.ndarray], int]:
    """``leaves`` where an empty one that says no shape of its rows (a JSON ``[]``, a Parquet
    row group of empty lists: ``(0, 0)``) takes the rows' shape the most of the others have
    (a graph of no edges: ``(0, 2)``), and the first leaf of that shape, which the others are
    told against. An empty one of a shape, ``(0, 4)``, is compared as it is: made another
    record's shape, a record of 5 columns beside it passed, or was told as it."""
    said = [j for j, leaf in enumerate(leaves) if len(leaf) or (
        leaf.ndim > 1 and 0 not in leaf.shape[1:])]
    if not said:
        return leaves, 0
    counts = collections.Counter(leaves[j].shape[1:] for j in said)
    common = max(counts, key=counts.__getitem__)  # (the first of the most: ties keep the order)
    first, told = next(j for j in said if leaves[j].shape[1:] == common), set(said)
    return [leaf if j in told or leaf.shape[1:] == common else
            np.empty((0, *common), leaf.dtype) for j, leaf in enumerate(leaves)], first


def _kind(pad: Pad, key: str, leaves: list[np.ndarray], names: Any) -> np.dtype:
    """The dtype of the batch's padded leaf: its records' (one), where an empty one (an empty
    Python list, float64 by NumPy's default) takes the others' (a document of no tokens)."""
    sized = [(j, leaf.dtype) for j, leaf in enumerate(leaves) if leaf.size]
    for j, kind in sized:
        if kind != sized[0][1]:
            raise CollateError(
                f"{pad!r}: {key!r} of {tree_lib.record_name(names, sized[0][0])} is "
                f"{sized[0][1]} and of {tree_lib.record_name(names, j)} {kind}; give every "
                "record one dtype there: cast in a Map before the Pad")
    return sized[0][1] if sized else leaves[0].dtype


def _check_value(pad: Pad, key: str, kind: np.dtype) -> None:
    """Refuses a ``value`` that ``kind`` cannot hold as it is (-1 in uint8, 0.5 in int32)."""
    value = pad.values[key]
    held, kept = held_as(value, kind)
    if not kept:
        example = (f"np.{kind.name.split('[')[0]}('NaT', {np.datetime_data(kind)[0]!r})"
                   if kind.kind in "mM" else f"one it holds ({kind} from {_finite(kind)})"
                   if number_kind(kind) in "fc" else "a value of its kind")
        raise CollateError(f"{pad!r}: {key!r} is {kind}, which cannot hold value="
                           f"{value!r} (it would be {held!r}); pass {example}" +
                           (f", for that key alone: value={{{key!r}: ..., ...}}"
                            if len(pad.keys) > 1 else ""))


def check_hosts(transforms: Sequence[Any], process_count: int) -> None:
    """Refuses a ``Pad`` to each batch's longest where several processes read a global
    batch: each pads to the longest of its own rows, and the global array needs one width."""
    for pad in transforms:
        if isinstance(pad, Pad) and None in pad.lengths.values() and process_count > 1:
            raise ConfigError(
                f"{pad!r}: each of the {process_count} processes pads its rows of a global "
                "batch to their own longest, so their widths differ where one array needs one; "
                "pass Pad(..., length=N), which pads every batch to N")


def _fields(pad: Pad, record: Any, names: Any, j: int) -> dict:
    """A copy of ``record`` (a dict, the batch's ``j``-th, named by ``names`` in an error: a
    stream's name reads its shard again, so only there) with its padded leaves as arrays."""
    if not isinstance(record, dict):
        raise CollateError(f"{pad!r}: {tree_lib.record_name(names, j)} is a "
                           f"{type(record).__name__}, expected a dict of leaves; return a dict "
                           "from a Map before the Pad")
    record = record.copy()  # (its kind kept: an OrderedDict, a defaultdict)
    for key in pad.keys:
        if key not in record:
            raise CollateError(f"{pad!r}: {tree_lib.record_name(names, j)} has no key {key!r} "
                               f"(its keys: {list(record)[:20]})")
        if np.ma.is_masked(record[key]):  # (copied into a padded array: the mask lost)
            raise CollateError(
                f"{pad!r}: {tree_lib.record_name(names, j)}'s {key!r} is a masked array with "
                f"{np.ma.count_masked(record[key])} masked value(s), whose fill values would "
                "be padded as data; in a Map before the Pad, fill them (x.filled(0)) and give "
                "the mask a key of its own (np.ma.getmaskarray(x)), which the Pad can pad too")
        leaf = _as_array(pad, record[key], pad.dtypes.get(key), names, j, key)
        if leaf.dtype.kind in "SU":
            raise CollateError(
                f"{pad!r}: {tree_lib.record_name(names, j)}'s {key!r} holds text "
                f"({leaf.dtype}), and a Pad pads numbers; make it numbers (token ids) in a Map "
                "before the Pad, or leave the key out of the Pad's keys")
        if leaf.ndim == 0 or leaf.dtype == object:
            raise CollateError(
                f"{pad!r}: {tree_lib.record_name(names, j)}'s {key!r} is "
                f"{type(record[key]).__name__} of shape {leaf.shape} and dtype {leaf.dtype}, "
                "expected an array (or list) of numbers with a length axis to pad; make it one "
                f"in a Map before the Pad{_arrays_of(leaf)}")
        suffix = pad.length_suffix
        if suffix is not None and key + suffix in record:
            raise CollateError(f"{pad!r}: {tree_lib.record_name(names, j)} already has the key "
                               f"{key + suffix!r} its lengths would take; pass another "
                               "length_suffix=")
        record[key] = leaf
    return record


def _arrays_of(leaf: np.ndarray) -> str:
    """What a Pad's error adds for an array of arrays: a Parquet list of lists comes as one
    where its row group's inner lists differ in length, maybe not this record's own (one bad
    row made its whole row group so, and the error named a row that held none)."""
    inner = [len(x) for x in leaf.flat if isinstance(x, np.ndarray)]
    if not inner or len(inner) != leaf.size:
        return ""
    where = ("these differ" if len(set(inner)) > 1 else "these agree, so another row of its "
             "row group differs")
    return (f" (np.stack(list(x))); it holds {len(inner)} arrays, inner lists of lengths "
            f"{inner[:8]}{'...' if len(inner) > 8 else ''}: a Parquet list of lists comes so "
            f"where its row group's inner lists are not of one length ({where}; "
            "pyarrow.compute.list_value_length(pyarrow.compute.list_flatten(column)) finds "
            "them)")


def _dict(given: Any) -> Any:
    """``given``, a mapping that is not a dict (a config's ``DictConfig``) made one."""
    return dict(given) if isinstance(given, Mapping) and not isinstance(given, dict) else given


def _each(keys: list[str], given: Any, name: str) -> dict[str, Any]:
    """``given`` for each of ``keys``: a dict of one for each key (a graph's node and edge
    budgets), or one for all."""
    if not isinstance(given, dict):
        return dict.fromkeys(keys, given)
    if set(given) != set(keys):
        raise ConfigError(f"Pad({name}): a dict gives the {name} of each key of {keys}, got "
                          f"one for {list(given)}")
    return given


def _finite(kind: np.dtype) -> str:
    """The range of a float ``kind``'s finite values, as text (its ``finfo``'s)."""
    try:
        info = finfo_of(kind)
        return f"{info.min} to {info.max}"
    except (ImportError, TypeError, ValueError):
        return "its finite values"


def _in_order(given: Any, keys: tuple) -> Any:
    """A dict given for each key, in the keys' order (the same Pad, the same text)."""
    return {key: given[key] for key in keys} if isinstance(given, dict) else given


def _dtype_text(kind: np.dtype) -> str:
    """``np.int32``, ``ml_dtypes.bfloat16``, or ``np.dtype('<M8[ns]')`` where neither names
    it."""
    if kind.type.__module__.startswith("ml_dtypes"):
        return f"ml_dtypes.{kind.name}"
    return f"np.{kind.name}" if getattr(np, kind.name, None) is kind.type else \
        f"np.dtype({kind.str!r})"


def _as_array(pad: Pad, value: Any, kind: np.dtype | None, names: Any, j: int,
              key: str) -> np.ndarray:
    """A record's leaf as an array, of ``kind`` where the ``Pad`` gives one (a list made so, an
    array cast): ints and bools into any number that holds each value, floats into floats
    (refused where one overflows), complex into complex; other kinds are refused."""
    try:
        given = np.asarray(value)
    except ValueError:  # (sequences of other lengths: NumPy's "inhomogeneous shape")
        raise CollateError(
            f"{pad!r}: {tree_lib.record_name(names, j)}'s {key!r} is a {type(value).__name__} "
            "of sequences of other lengths, which makes no array: a Pad pads the first axis "
            "only; in a Map before the Pad, pad each inner sequence to one width (np.stack of "
            "them padded to the longest, or to a fixed one) or give each a key of its own"
        ) from None
    if kind is None or given.dtype == kind or given.dtype == object:
        return given  # (objects: refused by the caller)
    made, lost = cast_kept(given, kind)
    if lost == "kind":
        raise CollateError(f"{pad!r}: {tree_lib.record_name(names, j)}'s {key!r} is "
                           f"{given.dtype}, which dtype={kind} would change in kind; cast it "
                           "in a Map before the Pad, or give the Pad a dtype of its kind")
    if lost:
        raise CollateError(f"{pad!r}: {tree_lib.record_name(names, j)}'s {key!r} holds values "
                           f"{kind} does not (from {np.nanmin(given)} to {np.nanmax(given)});"
                           " pass a dtype that holds them")
    return made
