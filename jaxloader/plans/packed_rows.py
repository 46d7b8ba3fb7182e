"""Packed rows, written one way for ``PackedSource`` and ``PackedStream`` alike.

::

    a row of width L, segment by segment ──>
        key               (L,)  the segments' tokens one after another, 0 after them
        key_segment_ids   (L,)  1..k for the row's k segments, 0 on padding
        key_positions     (L,)  0.. within each segment

and what a record's tokens must be: 1-D numbers (``token_problem``).

Example:
    >>> rows = PackedRows((5,), np.int32)
    >>> rows.place(slice(0, 3), np.array([7, 8, 9]), 1)
    >>> rows.place(slice(3, 5), np.array([4, 5]), 2)
    >>> {k: v.tolist() for k, v in rows.fields("t").items()}
    {'t': [7, 8, 9, 4, 5], 't_segment_ids': [1, 1, 1, 2, 2], 't_positions': [0, 1, 2, 0, 1]}
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import numpy as np

from jaxloader.base.number_kinds import held_as, ml_number, number_kind
from jaxloader.base.errors import ConfigError


class PackedRows:
    """Rows of ``shape`` (one row: ``(L,)``; a batch: ``(B, L)``), padding (``fill``) until
    placed."""

    __slots__ = ("tokens", "ids", "positions", "_count_up")

    def __init__(self, shape: tuple[int, ...], dtype: Any, fill: Any = 0) -> None:
        self.tokens = np.full(shape, fill, dtype) if fill else np.zeros(shape, dtype)
        self.ids = np.zeros(shape, np.int32)
        self.positions = np.zeros(shape, np.int32)
        self._count_up = _count_up(shape[-1])

    def place(self, where: Any, piece: np.ndarray, segment: int) -> None:
        """Segment ``segment`` (from 1), its tokens ``piece``, at ``where`` (a slice of a row,
        or ``(row, slice)`` of a batch)."""
        self.tokens[where] = piece
        self.ids[where] = segment
        self.positions[where] = self._count_up[:len(piece)]

    def place_batch(self, values: np.ndarray, begins: list[int], sizes: list[int],
                    rows: list[int], ats: list[int], segments: list[int]) -> None:
        """``place`` for many segments of a batch's rows: segment ``i`` is
        ``values[begins[i]:begins[i] + sizes[i]]``, in row ``rows[i]`` at ``ats[i]``, its
        ``segments[i]``-th (one loop here, not a call a segment)."""
        tokens, ids, positions, count_up = self.tokens, self.ids, self.positions, self._count_up
        for r, s, b, o, n in zip(rows, segments, begins, ats, sizes):
            tokens[r, o:o + n] = values[b:b + n]
            ids[r, o:o + n] = s
            positions[r, o:o + n] = count_up[:n]

    def fields(self, key: str) -> dict[str, np.ndarray]:
        """The rows' fields: ``key``, ``key_segment_ids`` and ``key_positions``."""
        return dict(zip(self.names(key), (self.tokens, self.ids, self.positions)))

    @staticmethod
    def names(key: str) -> tuple[str, str, str]:
        """The names of ``key``'s fields, as ``fields`` gives them."""
        return key, f"{key}_segment_ids", f"{key}_positions"


def check_field_names(where: str, keys: list[str]) -> None:
    """Refuses keys of which one's field is another's: ``["a", "a_positions"]``, whose fields
    were merged into one record, one of the two ``a_positions`` overwriting the other without
    a word (the sources audit).

    Example:
        >>> try:
        ...     check_field_names("PackedSource(keys=...)", ["a", "a_positions"])
        ... except ConfigError as e:
        ...     print(str(e)[:86])
        PackedSource(keys=...): the keys 'a' and 'a_positions' both make a field 'a_positions'
    """
    made: dict[str, str] = {}
    for key in keys:
        for name in PackedRows.names(key):
            if name in made and made[name] != key:
                first, then = sorted((made[name], key), key=keys.index)
                raise ConfigError(
                    f"{where}: the keys {first!r} and {then!r} both make a field {name!r} (a key "
                    "k makes k, k_segment_ids and k_positions), one overwriting the other; "
                    f"rename {max(first, then, key=len)!r} in the records before they are packed"
                    + (" (in what tokenize returns)" if where.startswith("PackedStream") else ""))
            made[name] = key


@functools.lru_cache(maxsize=16)
def _count_up(width: int) -> np.ndarray:
    """``0 .. width - 1``, made once a width (a stream's rows are made one by one)."""
    positions = np.arange(width, dtype=np.int32)
    positions.flags.writeable = False
    return positions


def token_problem(value: Any, empty_of_any_dtype: bool) -> tuple[np.ndarray, str | None]:
    """``value`` as an array, and what keeps it from being a record's tokens (1-D numbers:
    ids, a loss mask, a weight a token; where ``empty_of_any_dtype``, an empty one of any
    dtype, as ``np.asarray([])`` gives), or ``None``."""
    nested = (" (a list of lists: a nested column, a tokenizer's batch of sentences; flatten "
              "each record's, or write the column as one list a record)")
    try:
        array = value if type(value) is np.ndarray else np.asarray(value)
    except ValueError:  # (lists of other lengths: NumPy 2 makes no object array of them)
        return np.empty(0, object), f"lists of other lengths{nested}"
    if array.ndim != 1 or ((array.size or not empty_of_any_dtype)
                           and number_kind(array.dtype) not in "biuf"):  # (bfloat16 too)
        return array, f"shape {array.shape} dtype {array.dtype}" + (
            " (a tokenizer's return_tensors='np' gives one row of tokens: pass its [0])"
            if array.ndim == 2 and array.shape[0] == 1 else
            "; a key of several axes (a step's (T, 4) observations) cannot be packed: pack an "
            "index key and gather them in a Map after" if array.ndim >= 2 else nested
            if array.dtype == object and array.size and isinstance(
                array.flat[0], (list, tuple, np.ndarray)) else " (text: tokenize it first: "
            "a PackedStream's tokenize=, a MapSource under a PackedSource)"
            if array.dtype.kind in "US" or array.dtype == object and array.size
            and isinstance(array.flat[0], (str, bytes)) else "")
    return array, None


def record_tokens(record: Any, key: str, empty_of_any_dtype: bool,
                  no_key: Callable[[Any], Exception],
                  not_tokens: Callable[[str], Exception]) -> np.ndarray:
    """``record[key]`` as tokens (``token_problem``); else the error ``no_key(what came)``
    for a record without ``key`` or ``not_tokens(what it is)`` (each packer its own words:
    a ``PackedSource`` plans, a ``PackedStream`` reads)."""
    if not isinstance(record, Mapping) or key not in record:
        raise no_key(sorted(record) if isinstance(record, Mapping) else type(record).__name__)
    value, problem = token_problem(record[key], empty_of_any_dtype)
    if problem is not None:
        raise not_tokens(problem)
    return value


def fill_values(label: str, value: Any, keys: list[str]) -> list[Any]:
    """Each key's padding, from ``value``: a number for all, or ``{key: number}`` for each
    (labels' -100 beside ids' 0), refused otherwise, naming ``label``."""
    values = value if isinstance(value, Mapping) else dict.fromkeys(keys, value)
    if set(values) != set(keys) or not all(
            isinstance(v, (int, float, np.integer, np.floating, np.bool_)) or ml_number(v)
            for v in values.values()):
        raise ConfigError(f"{label}: expected a number (what pads the rows after their "
                          f"segments), or a dict of one for each key of {keys}, got "
                          f"{value!r:.120}")
    return [values[k] for k in keys]


def fills_said(fills: list[Any]) -> list[Any] | None:
    """The keys' paddings as a state says them (Python numbers), or ``None`` where all are
    zeros: states saved before the padding counted hold none."""
    said = [np.asarray(v).item() for v in fills]
    return said if any(said) else None


def check_fill(label: str, key: str, fill: Any, dtype: np.dtype) -> None:
    """Refuses a key's padding ``fill`` its tokens' ``dtype`` cannot hold (-100 in uint16)."""
    held, kept = held_as(fill, dtype)
    if not kept:
        raise ConfigError(f"{label}: {key!r} holds {dtype}, which cannot hold value={fill!r} "
                          f"(it would be {held!r}); pad it with a value of its kind")
