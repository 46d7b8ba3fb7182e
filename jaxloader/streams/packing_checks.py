"""What a ``PackedStream``'s readers check of a record's tokens as they read it (each key 1-D
numbers, as long as the tokens; keys left out that look packable said once) and of a window
(records cut by ``overlong="truncate"``, said once).

Example:
    >>> import numpy as np
    >>> as_long([0, 1, 1, 0], 4), as_long(np.ones(4, np.int64), 4)  # (a loss mask; a mask of 1s)
    (True, False)
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from jaxloader.base.errors import JaxloaderWarning, RecordError, user_stacklevel
from jaxloader.base.number_kinds import cast_kept, finfo_of, iinfo_of, number_kind
from jaxloader.plans.packed_rows import record_tokens

LOOKS = 64  # records looked at for keys as long as the tokens, left out (said once)


def check_aligned(packed: Any, record: Any, tokens: list[np.ndarray]) -> None:
    """Refuses keys of other lengths than the first's (they are cut at the same places), and
    says once which of the record's other keys are as long and left out (a loss mask
    ``tokenize`` made, not packed: the loss then counts every token)."""
    keys, n = packed.keys, len(tokens[0])
    for key, values in zip(keys[1:], tokens[1:]):
        if len(values) != n:
            raise RecordError(
                f"PackedStream: record[{key!r}] holds {len(values)} values, record"
                f"[{keys[0]!r}] {n}: the keys are packed at the same places, so each must be "
                "as long as the tokens (a loss mask, labels); pack keys of other lengths "
                "with a PackedStream each")
    if packed.left_out_looks < LOOKS:  # (the first records a process reads: said once)
        packed.left_out_looks += 1
        if warn_left_out("PackedStream", "key", record, keys, n):
            packed.left_out_looks = LOOKS


def warn_left_out(owner: str, argument: str, record: Any, keys: list[str], n: int) -> bool:
    """Warns of ``record``'s keys other than ``keys`` that are as long as its ``n`` tokens
    (``as_long``), which ``owner`` leaves out of its rows; whether there were such keys."""
    left = [k for k, v in record.items() if k not in keys and as_long(v, n)]
    if left:
        warnings.warn(
            f"{owner}: the records hold {left} as long as {keys[0]!r}, which are not packed "
            f"and left out of the rows; to pack them at the same places, pass {argument}="
            f"{[*keys, *left]!r} (a loss mask, labels: value= pads them)",
            JaxloaderWarning, stacklevel=user_stacklevel())
    return bool(left)


def as_long(value: Any, n: int) -> bool:
    """Whether ``value`` is a sequence of ``n`` numbers (a key one could pack beside: labels,
    a loss mask, a weight a token), not integers all 1 or all 0 (a tokenizer's attention mask
    or token type ids, which the segment ids stand for)."""
    shape = getattr(value, "shape", None)
    if shape is not None:  # (an array: NumPy's, JAX's, or a tensor with __array__)
        try:
            if tuple(shape) != (n,) or n < 2:
                return False
            values = np.asarray(value)
        except Exception:  # (a tensor NumPy cannot read: said nothing of, as before)
            return False
        if values.dtype.kind not in "biuf" and "float" not in values.dtype.name:
            return False  # (bfloat16, a weight a token, is of kind 'V')
    elif not (isinstance(value, (list, tuple)) and len(value) == n > 1 and all(
            isinstance(v, (int, float, np.number, np.bool_)) for v in value)):
        return False  # (every item: word_ids() ends in None; the first 64 records only)
    values = np.asarray(value)
    return values.dtype.kind not in "biu" or not (values.min() == values.max() in (0, 1))


def tokens_of(record: Any, key: str, dtype: np.dtype, first: bool) -> np.ndarray:
    value = record_tokens(
        record, key, True,
        lambda got: RecordError(f"PackedStream: expected a record (after tokenize) with key "
                                f"{key!r}: 1-D integer tokens, got {got}; pass tokenize= to "
                                "make them"),
        lambda problem: RecordError(f"PackedStream: record[{key!r}]: expected 1-D numbers "
                                    f"(tokens), got {problem}"))
    if first and value.dtype == np.bool_:  # (True, False read as ids 1, 0)
        raise RecordError(f"PackedStream: record[{key!r}]: expected integer tokens, got bools "
                          f"(shape {value.shape}); pack the token ids first: key=[ids, "
                          f"{key!r}]")
    if value.size and number_kind(value.dtype) == "f" and number_kind(dtype) != "f":
        raise RecordError(
            f"PackedStream: record[{key!r}]: expected 1-D integer tokens, got shape "
            f"{value.shape} dtype {value.dtype}; token ids are integers: make them so where "
            f"the records are made (np.asarray(ids, np.int32)) or in tokenize=" if first else
            f"PackedStream: record[{key!r}] holds {value.dtype} values, packed as {dtype}; "
            f"pass dtype={{{key!r}: np.float32, ...}} for it")
    if value.size and not np.can_cast(value.dtype, dtype) and _past(value, dtype):
        low, high = np.nanmin(value), np.nanmax(value)  # (a tokenizer's int64 ids; a float
        # made inf)
        wider = "np.int64" if number_kind(dtype) in "iu" else "np.float32" if max(
            abs(float(low)), abs(float(high))) <= _FLOAT32_MAX else "np.float64"
        raise RecordError(
            f"PackedStream: record[{key!r}] holds {'tokens' if first else 'values'} outside "
            f"{dtype} ([{low}, {high}]); pass dtype= a wider "
            + ("integer" if first else f"{'integer' if number_kind(dtype) in 'iu' else 'float'}"
               f" for it: dtype={{{key!r}: {wider}, ...}}"))
    return value


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _past(value: np.ndarray, dtype: np.dtype) -> bool:
    """Whether ``value`` holds a value past ``dtype``'s range: an int's, or a float's largest
    (made infinite; ints rounded into a float are kept, as a float rounded is). Two reductions
    (a record's weights, every record): ``cast_kept`` where they are not finite (NaN, inf)."""
    low, high = value.min(), value.max()
    if number_kind(dtype) in "iu":
        info = iinfo_of(dtype)
        return bool(low < info.min or high > info.max)
    if not (np.isfinite(low) and np.isfinite(high)):
        return cast_kept(value, dtype)[1] != ""
    return bool(max(abs(float(low)), abs(float(high))) > float(finfo_of(dtype).max))


def warn_truncated(packed: Any, lengths: list[int]) -> None:
    """Says once, where ``overlong="truncate"`` cuts records of a window (of ``lengths``
    tokens) to the row, how many tokens go (a ``PackedSource`` lists them in ``truncated``; a
    stream's went unsaid: the sign that the row is shorter than the data)."""
    cut = [n - packed.length for n in lengths if n > packed.length]
    if packed.overlong != "truncate" or not cut or packed.said_truncated:
        return
    packed.said_truncated = True
    warnings.warn(
        f"PackedStream(overlong='truncate'): {len(cut)} of a window's {len(lengths)} records "
        f"are longer than a row of {packed.length} tokens and cut to it ({sum(cut):,} of their "
        f"{sum(cut) + packed.length * len(cut):,} tokens left out; said once a process); "
        "overlong='split' packs the rest into the next rows", JaxloaderWarning,
        stacklevel=user_stacklevel())
