"""``RaggedSource``: variable-length sequences stored flat, one offsets array per key.

Record ``i`` of key ``k`` is ``values[k][offsets[k][i]:offsets[k][i + 1]]`` (the layout of
Megatron's indexed datasets and of Arrow's list arrays). Its lengths are known without reading a
record, which is what packing needs (``jaxloader.PackedSource``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from jaxloader.base.checks import record_index
from jaxloader.base.errors import ConfigError
from jaxloader.base.loader_names import loader_names
from jaxloader.base.mapped_files import MappedFiles
from jaxloader.base.number_kinds import cast_kept
from jaxloader.sources.protocol import Source


@loader_names("source")
class RaggedSource(Source):
    """Records ``{key: 1-D array}`` cut from flat ``values`` at ``offsets`` (``n + 1`` of them,
    from 0, non-decreasing, the last ``len(values)``), one pair per key.

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> tokens = jl.RaggedSource({"ids": (np.arange(6), np.array([0, 2, 2, 6]))})
        >>> len(tokens), tokens[2]["ids"].tolist(), tokens.lengths("ids").tolist()
        (3, [2, 3, 4, 5], [2, 0, 4])
    """

    def __init__(self, columns: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> None:
        if not isinstance(columns, Mapping) or not columns:
            raise ConfigError(
                "RaggedSource(columns): expected {key: (values, offsets)}, got "
                f"{type(columns).__name__}; e.g. RaggedSource({{'tokens': (flat, offsets)}})"
            )
        self._values: dict[str, np.ndarray] = {}
        self._offsets: dict[str, np.ndarray] = {}
        counts = {}
        for key, pair in columns.items():
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ConfigError(f"RaggedSource[{key!r}]: expected (values, offsets), got "
                                  f"{type(pair).__name__}")
            values, offsets = np.asarray(pair[0]), np.asarray(pair[1])
            _check(key, values, offsets)
            self._values[key], self._offsets[key] = values, offsets.astype(np.int64)
            counts[key] = len(offsets) - 1
        if len(set(counts.values())) != 1:
            raise ConfigError(f"RaggedSource: every key must have as many records, got {counts}; "
                              "give each key n + 1 offsets for the same n records")
        self._len = next(iter(counts.values()))
        self._mapped = MappedFiles("RaggedSource", self._values.values())

    @classmethod
    def from_sequences(cls, columns: Mapping[str, Sequence[Any]],
                       dtype: Any = None) -> "RaggedSource":
        """Builds one from lists of 1-D arrays (or lists), one list per key.

        Example:
            >>> import numpy as np, jaxloader as jl
            >>> jl.RaggedSource.from_sequences({"t": [[1, 2], [3]]}, dtype=np.int32)[0]["t"]
            array([1, 2], dtype=int32)
        """
        if not isinstance(columns, Mapping) and not (hasattr(columns, "columns") and callable(
                getattr(columns, "items", None))):  # (a dict, or a DataFrame: its columns;
            # not a Series, whose items are its rows)
            shown = " ".join(repr(columns).split())[:60]
            name = getattr(columns, "name", None)  # (a Series': its column's)
            raise ConfigError(
                f"RaggedSource.from_sequences(columns): expected a dict of a key to its list of "
                f"sequences, got {type(columns).__name__} {shown}; name the column: "
                f"RaggedSource.from_sequences({{{name if isinstance(name, str) else 'tokens'!r}"
                ": sequences})")
        pairs = {}
        for key, seqs in columns.items():
            arrays = [_as_values(s, dtype, key, i) for i, s in enumerate(seqs)]
            for i, array in enumerate(arrays):  # (reshape(-1) made a (T, 4) episode 4T steps;
                if array.ndim != 1 and sum(n > 1 for n in array.shape) < 2:  # a scalar, a
                    arrays[i] = array = array.reshape(-1)  # tokenizer's (1, T): one axis)
                if array.ndim != 1:
                    raise ConfigError(
                        f"RaggedSource.from_sequences: {key!r} of sequence {i} has shape "
                        f"{array.shape}, expected 1-D (a record's values along one axis); "
                        f"{_FLAT_ONLY}")
            offsets = np.concatenate([[0], np.cumsum([len(a) for a in arrays])]).astype(np.int64)
            if dtype is None:  # (an empty record, np.asarray([]), is float64: the values' own
                held = [a.dtype for a in arrays if a.size] or [  # dtype, not a float for all;
                    a.dtype for a, s in zip(arrays, seqs) if hasattr(s, "dtype")]  # all empty:
                common = np.result_type(*held) if held else np.dtype(np.int64)  # arrays' own)
                _check_promoted(key, arrays, common)
                arrays = [a if a.size else a.astype(common) for a in arrays]
            values = np.concatenate(arrays) if arrays else np.zeros(0, dtype or np.int64)
            pairs[key] = (values, offsets)
        return cls(pairs)

    @property
    def keys(self) -> list[str]:
        return list(self._values)

    def lengths(self, key: str) -> np.ndarray | None:
        """Every record's length for ``key`` (no record read); ``None`` for a key the records
        lack, which a reader then names (``PackedSource``: the keys a record has)."""
        return np.diff(self._offsets[key]) if key in self._offsets else None

    def flat(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """The flat values and offsets of ``key`` (read-only views)."""
        values, offsets = self._values[key].view(), self._offsets[key].view()
        values.flags.writeable = offsets.flags.writeable = False
        return values, offsets

    def __len__(self) -> int:
        return self._len

    def check_mapped(self, soon: bool = False) -> None:
        """Refuses a memory-mapped values file (``np.load(path, mmap_mode="r")``) changed in
        place since the source was made (``MappedFiles``): read, one cut shorter ends the
        process by SIGBUS, with no word. Before each batch a loader makes of it, or of a
        source over it (``BatchMaker``); ``soon``: at most every 10 ms (a record's own read,
        a ``PackedSource``'s rows read outside a loader)."""
        self._mapped.watch(soon)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        self.check_mapped(soon=True)
        index = record_index(index, self._len, "RaggedSource")
        out = {}
        for key, values in self._values.items():
            offsets = self._offsets[key]
            view = values[offsets[index]:offsets[index + 1]]
            view.flags.writeable = False
            out[key] = view
        return out

    @property
    def fingerprint(self) -> str:
        """Its length, keys, dtypes, and a key's offsets and values sampled (every n/64-th,
        and the last value): other data of the same lengths is another source (where the
        samples differ: not a hash of all)."""
        import hashlib

        digest = hashlib.blake2b(digest_size=16)
        for key in self._values:
            digest.update(key.encode(errors="surrogatepass"))
            digest.update(self._offsets[key][:: max(1, self._len // 64)].tobytes())
            values = self._values[key]  # 64 values spread over the data, and the last one:
            digest.update(values[:: max(1, len(values) // 64)].tobytes())  # other data with
            digest.update(values[-1:].tobytes())  # the same lengths is another source
            digest.update(str(values.dtype).encode())
        return f"ragged:{self._len}:{digest.hexdigest()}"

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}: {len(v)} {v.dtype}" for k, v in self._values.items())
        return f"RaggedSource({self._len} records; {parts})"


_FLAT_ONLY = (
    "a RaggedSource holds sequences of single values, a key each: give each feature its own "
    "key, or keep records of several axes (a graph's (n, 4) nodes, an episode's (T, 4) "
    "observations) in a list of dicts or a source of your own, padded by jl.Pad")


def _check(key: str, values: np.ndarray, offsets: np.ndarray) -> None:
    if values.ndim != 1 or values.dtype.hasobject:
        raise ConfigError(f"RaggedSource[{key!r}] values: expected a 1-D numeric array (the "
                          f"sequences concatenated), got shape {values.shape} dtype "
                          f"{values.dtype}" + (f"; {_FLAT_ONLY}" if values.ndim > 1 else ""))
    if (offsets.ndim != 1 or len(offsets) < 1 or offsets.dtype.kind not in "iu"
            or offsets[0] != 0 or offsets[-1] != len(values)
            or np.any(offsets[1:] < offsets[:-1])):  # (np.diff wraps unsigned offsets)
        raise ConfigError(
            f"RaggedSource[{key!r}] offsets: expected integers from 0 to len(values) "
            f"({len(values)}), non-decreasing, got {offsets[:4].tolist()}...{offsets[-2:].tolist()}"
            f" (shape {offsets.shape}); offsets[i]:offsets[i + 1] are record i's values"
        )


def _as_values(sequence: Any, dtype: Any, key: str, i: int) -> np.ndarray:
    """A sequence's values as an array, of ``dtype`` where given: refused where the cast
    loses what they are (as a ``Pad``'s ``dtype=``: a node id past 2**31 wrapped into another
    in int32, 1.7 cut to 1, 1e5 made inf in float16)."""
    given = np.asarray(sequence)
    if dtype is None:
        return given
    if given.dtype == object:  # (Python numbers NumPy found no one type for: None, 2**70)
        return _objects_cast(given, np.dtype(dtype), key, i)
    made, lost = cast_kept(given, np.dtype(dtype))
    if lost:
        held = (f"from {np.nanmin(given)} to {np.nanmax(given)}" if given.dtype.kind in "biufmM"
                else f"{given.reshape(-1)[:3].tolist()}") if given.size else ""
        raise ConfigError(
            f"RaggedSource.from_sequences: {key!r} of sequence {i} is {given.dtype} "
            + (f"({held}), which dtype={np.dtype(dtype)} would change in kind; round or cast "
               "the values first, or pass a dtype of their kind" if lost == "kind" else
               f"and holds values {np.dtype(dtype)} does not ({held}); pass a dtype that "
               "holds them (np.int64 for ids past 2**31, a finer unit for times)"))
    return made


def _objects_cast(given: np.ndarray, dtype: np.dtype, key: str, i: int) -> np.ndarray:
    """A sequence of Python objects cast to ``dtype``, refused where that changes one (None
    made NaN or False, 1.7 cut to 1, an int past 2**53 rounded) or cannot (2**70 in int64)."""
    values = given.reshape(-1).tolist()
    at = next((j for j, v in enumerate(values) if v is None), None)
    why = f"None, which dtype={dtype} has no value for"
    if at is None:
        try:
            made = np.asarray(values, dtype=dtype).reshape(given.shape)
            at = next((j for j, (a, b) in enumerate(zip(made.reshape(-1).tolist(), values))
                       if not (a == b or a != a and b != b  # (NaN is NaN; a float
                               or type(b) is float and dtype.kind in "fc"  # rounded, not made
                               and (np.isfinite(a) or not np.isfinite(b)))), None)  # inf)
            if at is None:
                return made
            why = f"made {made.reshape(-1).tolist()[at]!r}"
        except (OverflowError, ValueError, TypeError) as e:
            why = f"{type(e).__name__}: {e}"
            at = next((j for j, v in enumerate(values) if type(v) is int and  # (too large)
                       not -2**63 <= v < 2**64), None)
    raise ConfigError(
        f"RaggedSource.from_sequences: {key!r} of sequence {i} holds "
        + (f"{values[at]!r} at position {at}" if at is not None else "values") + f" ({why}): "
        f"dtype={dtype} cannot hold it as it is; fill the missing values, or pass a dtype "
        "that holds them (np.int64 for ids past 2**31, np.float64 for fractions)")


def _check_promoted(key: str, arrays: list[np.ndarray], common: np.dtype) -> None:
    """Refuses sequences of other dtypes that NumPy's common one (``common``) changes: ids
    past 2**53 beside a float rounded, a uint64 past 2**63 beside an int64 made float64,
    booleans made numbers (a mask beside ids)."""
    for i, array in enumerate(arrays):
        if not array.size or array.dtype == common or common == object or (  # (objects:
                array.dtype.kind == common.kind and common.kind in "US"):  # refused as made,
            continue  # naming the value; strings widened: kept)
        _, lost = cast_kept(array, common)
        if lost or (array.dtype == np.bool_) != (common == np.bool_):
            raise ConfigError(
                f"RaggedSource.from_sequences: the sequences of {key!r} are of dtypes "
                f"{sorted({str(a.dtype) for a in arrays if a.size})}, which NumPy makes one "
                f"{common}, changing sequence {i}'s {array.dtype} values"
                + ("" if lost else " (booleans made numbers)") + "; make them one dtype, or "
                "pass dtype= one that holds them all")
