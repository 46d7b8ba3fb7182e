"""The ``CollateError`` for a leaf whose records differ (shape, dtype, kind, None among
values), with the remedy that fits the difference: a cast, a Pad, a fill value, an image
mode, an int past int64.

Example:
    >>> raise_leaf_mismatch("['y']", [np.int32(1), np.float64(0.5)], None)
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    jaxloader.base.errors.CollateError: batch leaf ['y']: records differ: ... cast in a Map ...
"""

from __future__ import annotations

from typing import Any, NoReturn

import numpy as np

from jaxloader.base import tree as tree_lib
from jaxloader.base.errors import CollateError
from jaxloader.batching.object_leaves import has_array_protocol, type_name


def beyond_int64(path: str, values: list, names: Any) -> CollateError:
    """The error for a Python int past int64 (an id 2**63) among a leaf's ``values``, which
    Python ints batch as: said as such after NumPy ints too (told to pad, there)."""
    j = next(j for j, v in enumerate(values) if isinstance(v, int) and scalar_dtype(v) is None)
    return CollateError(
        f"batch leaf {path}: {tree_lib.record_name(names, j)} holds the int "
        f"{values[j]}, beyond int64 (-2**63..2**63-1), which Python ints batch as "
        "(a batch of them would come out as another dtype than the others); keep it "
        "as a string, split it into int64 parts, or make it np.uint64(x), in a Map")


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


def scalar_dtype(value: Any) -> np.dtype | None:
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
        return (type(v), scalar_dtype(v))

    def describe(v: Any) -> str:
        if isinstance(v, (np.ndarray, np.generic)):
            return f"shape {v.shape} dtype {v.dtype}"
        dtype = scalar_dtype(v)
        batched = f" (batched as {dtype})" if dtype is not None else ""
        return "None" if v is None else f"{type_name(v)} {v!r:.40}{batched}"

    first = kind(values[0])
    for j, v in enumerate(values):
        if kind(v) != first:
            if any(isinstance(x, int) and scalar_dtype(x) is None for x in values):
                raise beyond_int64(path, values, names)
            if _missing(v) or _missing(values[0]):  # (None, pandas' NA and NaT)
                fix = f"give every record {_none_fill(values[0] if _missing(v) else v)} " \
                    f"there, not {v if _missing(v) else values[0]}"
            elif first[0] in (str, bytes) and kind(v)[0] in (str, bytes):
                fix = ("give every record one of them there: decode the bytes (or encode the "
                       "str) in a Map")
            elif scalar_dtype(v) is not None and (dtype := scalar_dtype(values[0])) is not None:
                fix = _one_dtype(np.dtype(dtype), np.dtype(scalar_dtype(v)))  # (the first's
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
    if scalar_dtype(given) is not None:
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
