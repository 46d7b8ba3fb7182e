"""What a number dtype holds: its kind (ml_dtypes' numbers by theirs, which NumPy calls ``V``),
its limits, and whether a value cast to it is held as it is (what pads a ``Pad``'s or a
packer's rows, what a ``Pad(dtype=)`` cast keeps).

Example:
    >>> import ml_dtypes
    >>> number_kind(np.dtype(ml_dtypes.bfloat16)), number_kind(np.dtype("V2"))
    ('f', 'V')
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np


def number_kind(dtype: np.dtype) -> str:
    """A dtype's kind, ml_dtypes' numbers (``bfloat16``, ``float8_*``, ``int4``) by theirs:
    NumPy calls them ``V``, raw bytes."""
    if dtype.kind == "V" and dtype.type is not np.void:
        return {"f": "f", "b": "f", "i": "i", "u": "u"}.get(dtype.name[:1], "V")
    return dtype.kind


def float_kind(kind: np.dtype) -> bool:
    """Whether ``kind`` is a float or complex dtype, ml_dtypes' floats too."""
    return number_kind(kind) in "fc"


def ml_number(value: Any) -> bool:
    """Whether ``value`` is a scalar of ml_dtypes' numbers (``bfloat16``, ``float8_*``,
    ``int4``), which NumPy holds as ``np.generic`` of kind ``V``, not ``np.number``.

    Example:
        >>> ml_number(np.float32(1)), ml_number(np.void(b"x"))
        (False, False)
    """
    dtype = getattr(value, "dtype", None)
    return isinstance(value, np.generic) and dtype is not None and dtype.kind == "V" and (
        number_kind(dtype) in "fiu")


def finfo_of(kind: np.dtype) -> Any:
    """``np.finfo`` of a float ``kind``, ml_dtypes' own for its floats."""
    if kind.kind in "fc":
        return np.finfo(kind)
    import ml_dtypes  # (NumPy's finfo knows not its floats)

    return ml_dtypes.finfo(kind)


def iinfo_of(kind: np.dtype) -> Any:
    """``np.iinfo`` of an int ``kind``, ml_dtypes' own for its ints (``int4``, ``uint4``)."""
    if kind.kind in "iu":
        return np.iinfo(kind)
    import ml_dtypes  # (NumPy's iinfo knows not its ints)

    return ml_dtypes.iinfo(kind)


def held_as(value: Any, kind: np.dtype) -> tuple[Any, bool]:
    """``value`` cast to ``kind``, and whether that holds it as it is (-1 in uint8, 0.5 in
    int32 do not; NaN in a float does); a float ``kind`` holds what it rounds (0.1, a
    ``np.float64``'s too), not what it makes infinite, NaN or finite (-1e9 in float16; NaN in
    ``float4_e2m1fn``, which has none): what pads a ``Pad``'s or a packer's rows.

    Example:
        >>> held_as(-100, np.dtype(np.int32))[1], held_as(-1, np.dtype(np.uint8))[1]
        (True, False)
        >>> held_as(np.float64(0.1), np.dtype(np.float32))[1]
        True
        >>> held_as(-1e9, np.dtype(np.float16))[1], held_as(np.inf, np.dtype(np.float16))[1]
        (False, True)
    """
    try:
        with np.errstate(invalid="ignore", over="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (a complex value's cast warns of its part lost)
            held = np.asarray(value).astype(kind)
            if float_kind(kind):
                return held, _rounds(np.asarray(value, np.complex128), np.asarray(
                    held, np.complex128), kind)
            return held, bool(held == value or (held != held and value != value))
    except (OverflowError, TypeError, ValueError):  # (an int past uint64: NumPy's object)
        return None, False


def _rounds(value: np.ndarray, held: np.ndarray, kind: np.dtype) -> bool:
    """Whether ``held`` is ``value`` in ``kind`` but for rounding (both as complex128)."""
    if np.isnan(value) or np.isnan(held):
        return bool(np.isnan(value) and np.isnan(held))
    if np.isinf(value) or np.isinf(held):
        return bool(value == held)
    return bool((kind.kind == "c" or value.imag == 0) and max(abs(value.real), abs(
        value.imag)) < saturated_past(kind))


def saturated_past(kind: np.dtype) -> float:
    """From what a float ``kind`` with neither inf nor NaN (``float4_e2m1fn``) clamps a value
    to its largest, more than rounding does (a tie rounds to the even step past it); inf for
    a kind with either (what it makes then is told apart: inf, NaN), or not a float."""
    if not float_kind(kind):
        return np.inf
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = np.array([np.inf, np.nan]).astype(kind).astype(np.float64)
    if not np.isfinite(made).all():
        return np.inf
    info = finfo_of(kind)  # (its largest and half the step past it: what rounds to it)
    return float(info.max) + float(info.eps) * 2.0 ** (int(info.maxexp) - 1) / 2


_INTO = {"b": "biuf", "i": "biuf", "u": "biuf", "f": "fc", "c": "c", "m": "m", "M": "M"}


def cast_kept(given: np.ndarray, kind: np.dtype) -> tuple[np.ndarray, str]:
    """``given`` cast to ``kind``, and what the cast loses (``""``: nothing): ``"kind"``, a
    cast into another kind (a float into an int: its fractions; only ints and bools go into
    any number, floats into floats, complex into complex); ``"values"``, a value ``kind`` does
    not hold (an int past its range, -1 in uint8, past 2**53 in float64; a float made
    infinite, or clamped; a time cut to a coarser unit). A float rounded into a narrower float is kept: what a ``Pad``'s
    ``dtype=`` and a ``RaggedSource``'s cast.

    Example:
        >>> cast_kept(np.array([1, 2**40]), np.dtype(np.int32))[1]
        'values'
        >>> cast_kept(np.array([0.5]), np.dtype(np.int32))[1], cast_kept(np.array([-1]),
        ...     np.dtype(np.int8))[1]
        ('kind', '')
    """
    if given.size and number_kind(kind) not in _INTO.get(number_kind(given.dtype), ""):
        return given, "kind"
    with np.errstate(all="ignore"):
        try:
            made = given.astype(kind)
        except OverflowError:  # (NumPy 2.5: a date past datetime64[ns]'s years, as it casts)
            return given, "values"
        if not given.size:
            return made, ""
        if given.dtype.kind in "mM":  # (times: a coarser unit cuts 1500 ms to 1 s; a finer
            back = made.astype(given.dtype)  # one overflows far dates; NaT stays NaT)
            lost = not np.all((back == given) | (np.isnat(back) & np.isnat(given)))
        elif number_kind(given.dtype) in "biu":  # (back: in float64 an int past 2**53 is equal;
            lost = not np.array_equal(made.astype(given.dtype), given) or (  # -1 in uint8
                number_kind(kind) in "iu" and not _in_range(given, kind))
        else:  # (an overflow: inf, NaN in a type with no inf (float8_e4m3fn), or the
            # largest, in a type of neither (float4_e2m1fn); complex: by each part)
            part = np.maximum(np.abs(given.real), np.abs(given.imag))
            lost = number_kind(given.dtype) in "fc" and bool(np.any(
                (np.isinf(made) != np.isinf(given)) | (np.isnan(made) != np.isnan(given))
                | (np.isfinite(given) & (part >= saturated_past(kind)))))
    return made, "values" if lost else ""


def _in_range(given: np.ndarray, kind: np.dtype) -> bool:
    """Whether an int ``kind`` holds each of ``given``'s ints (a cast back and forth wraps
    -1 into uint8 and back unseen)."""
    info = iinfo_of(kind)
    return int(info.min) <= int(given.min()) and int(given.max()) <= int(info.max)
