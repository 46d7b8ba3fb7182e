"""Column primitives that sources make and collation consumes: an object column (one entry a
row, whatever the rows are) and ``DeferredTake`` (rows still to gather, gathered straight into a
batch's slot); and what a column's dtype is to JAX (``host_only``: none, it stays NumPy;
``device_dtype_problem``: none, and a ``Map`` would make one), asked where leaves are placed and
where a ``JitMap`` takes them; the memory-mapped file a column views (``memmap_under``) and the
bytes a view's elements span (``byte_span``: windows overlap).

Example:
    >>> DeferredTake(np.arange(10) * 2, np.array([3, 1])).taken().tolist()
    [6, 2]
"""

from __future__ import annotations

import ctypes
import os
import warnings
from typing import Any, Callable, NamedTuple

import numpy as np

from jaxloader.base.errors import JaxloaderWarning, user_stacklevel


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


class DeferredTake(NamedTuple):
    """A leaf still to gather: rows ``indices`` of ``array`` (written straight into a slot;
    ``indices`` in range, as a sampler's or a join's rows are: taken with ``mode="clip"``)."""

    array: np.ndarray
    indices: np.ndarray

    def rows(self, a: int, b: int) -> "DeferredTake":
        """Rows ``a`` to ``b`` of it, still to gather."""
        return DeferredTake(self.array, self.indices[a:b])

    def taken(self, out: np.ndarray | None = None) -> np.ndarray:
        """The rows gathered (into ``out`` when given)."""
        array = self.array
        if array.flags.c_contiguous:  # (take_rows' first case, inline: once a leaf a batch)
            return array.take(self.indices, 0, out, "clip")
        return take_rows(array, self.indices, out)


def take_rows(array: np.ndarray, indices: np.ndarray,
              out: np.ndarray | None = None) -> np.ndarray:
    """Rows ``indices`` of ``array`` (in range), into ``out`` when given. ``take`` with
    ``mode="clip"`` (the default ``"raise"`` makes a buffered copy for ``out=``: 3.5x) where
    the array is C-contiguous; others (a ``sliding_window_view``'s windows, a column slice, a
    ``broadcast_to``) by indexing: ``take`` copied the whole array first, every batch (a
    replay buffer's frame stacks: 565 MB for a batch of 0.9 MB)."""
    if array.flags.c_contiguous:
        return array.take(indices, 0, out, "clip")
    if out is None:
        return array[indices]
    out[...] = array[indices]
    return out


def spaced_values(array: np.ndarray, most: int) -> np.ndarray:
    """At most ``most`` evenly spaced values of ``array`` (the first, then every ``step``-th in
    C order), as a new 1-D array: only they are copied, whatever the layout (``ravel`` of a
    transposed array would copy it whole). What a watch or a digest compares of an array too
    large to read.

    Example:
        >>> spaced_values(np.arange(12).reshape(3, 4).T, 5).tolist()  # (of 0 4 8 1 5 9 2 ...)
        [0, 1, 2, 3]
    """
    return array.flat[::-(-array.size // max(1, most)) or 1]


def device_dtype_problem(dtype: np.dtype) -> str | None:
    """Why JAX takes no array of ``dtype``, though it is no string, object or date (those stay
    NumPy), and the ``Map`` that makes one it takes; ``None`` where it takes it (the numbers,
    in this machine's byte order, bfloat16 and the other ``ml_dtypes``).

    Example:
        >>> device_dtype_problem(np.dtype(">f4"))[:41]
        'dtype >f4 is of the other byte order than'
        >>> device_dtype_problem(np.dtype("<f4")) is None
        True
    """
    if dtype.names is not None:
        return (f"dtype {dtype} is structured, which JAX has no type for; make each field a "
                "leaf of its own in a Map ({name: x[name] for name in x.dtype.names})")
    if not dtype.isnative:
        return (f"dtype {dtype} is of the other byte order than this machine's, which JAX "
                "does not take; make it native in a Map (x.astype(x.dtype.newbyteorder('=')))")
    if dtype.kind == "V" and dtype.type is np.void:
        saved = (" (bfloat16 saved by np.save or np.savez reads back as |V2: "
                 "x.view(ml_dtypes.bfloat16))" if dtype.itemsize == 2 else "")
        return (f"dtype {dtype} is raw bytes, which JAX has no type for; view them as numbers "
                f"in a Map (x.view(np.uint8)){saved}")
    if dtype.kind in "fc" and dtype.itemsize > (8 if dtype.kind == "f" else 16):
        kind = "float64" if dtype.kind == "f" else "complex128"
        return (f"dtype {dtype} is extended precision (np.longdouble), which JAX has no type "
                f"for; cast it in a Map (x.astype(np.{kind}))")
    return None


def host_only(dtype: np.dtype) -> bool:
    """Whether JAX has no array type for ``dtype``: objects, ``str``/``bytes`` of a fixed
    width (``<U8``, ``S8``) and dates/durations (``datetime64``, ``timedelta64``), which stay
    NumPy. (bfloat16 and the other ``ml_dtypes`` are of kind ``V`` and go to the device.)

    Example:
        >>> host_only(np.dtype("<U8")), host_only(np.dtype(np.float32))
        (True, False)
    """
    return dtype.hasobject or dtype.kind in "USMm"


def beyond_32_bits(values: np.ndarray | np.generic) -> tuple[Any, Any, Any] | None:
    """``(lowest, highest, the 32-bit range)`` of 64-bit integers that 32 bits cannot hold,
    which JAX without x64 takes as 32-bit and would wrap, or of finite 64-bit floats beyond
    float32's range (complex128's real and imaginary parts too), which it would make infinite;
    ``None`` where they fit (or are neither).

    Example:
        >>> beyond_32_bits(np.array([1, 2**40]))[:2], beyond_32_bits(np.array([1, 2]))
        ((1, 1099511627776), None)
        >>> beyond_32_bits(np.array([1.0, 1e39, np.inf]))[:2]
        (1.0, 1e+39)
        >>> beyond_32_bits(np.array([1 + 2j, 1e300j]))[:2]
        (0.0, 1e+300)
    """
    kind = values.dtype.kind
    if kind == "c" and values.dtype.itemsize == 16 and values.size:  # (complex128: its parts,
        return beyond_32_bits(np.concatenate([np.ravel(values.real),  # which complex64's
                                              np.ravel(values.imag)]))  # float32s hold)
    if kind not in "iuf" or values.dtype.itemsize != 8 or not values.size:
        return None
    if kind == "f":  # (already infinite or NaN: stays so; a finite one may not)
        low, high = values.min(), values.max()
        if not (np.isfinite(low) and np.isfinite(high)):
            finite = np.asarray(values)[np.isfinite(values)]
            if not finite.size:
                return None
            low, high = finite.min(), finite.max()
        return None if -_ROUNDS_TO_INF < low and high < _ROUNDS_TO_INF else (
            float(low), float(high), _FLOAT32)
    low, high = int(values.min()), int(values.max())
    bounds = _UINT32 if kind == "u" else _INT32
    return None if bounds.min <= low and high <= bounds.max else (low, high, bounds)


def whole_past_float32(values: np.ndarray | np.generic) -> bool:
    """Whether float64 ``values`` are all whole numbers, some past 2**24, where float32 (JAX's
    without x64) holds no longer each whole number: times in seconds, ids written as floats
    (pandas' ``.astype(float)``), which it rounds together (a minute apart, 128 s steps, two
    of them one); fractions lose precision as any cast to float32 makes them lose it.

    Example:
        >>> whole_past_float32(np.array([1.7e9, 1.7e9 + 60])), whole_past_float32(np.ones(3))
        (True, False)
    """
    if values.dtype != np.float64 or not values.size:
        return False
    finite = np.asarray(values)[np.isfinite(values)] if not np.isfinite(
        values).all() else np.asarray(values)
    big = float(np.abs(finite).max()) if finite.size else 0.0
    return big > 2.0 ** 24 and np.array_equal(finite, np.trunc(finite))


def warn_whole(values: Any, path: Callable[[], str], leaf: str, does: str) -> None:
    """Warns, once a ``leaf`` in this process, where ``values`` (float64) are whole numbers
    float32 rounds together (``whole_past_float32``); looks at the process's first 256."""
    if _LOOKS_LEFT[0] <= 0:  # (its first float64 leaves: such data shows in the first
        return  # batches; not a pass over every batch's after)
    _LOOKS_LEFT[0] -= 1
    if not whole_past_float32(values):
        return
    named = f"{leaf} {path()}"
    if named in _WARNED:
        return
    _WARNED.add(named)
    warnings.warn(  # (its values unsaid: the same text from every worker, said once)
        f"{named} is float64 of whole numbers past 2**24, which JAX without x64 {does} as "
        "float32, in steps of 2 or more there (128 near 2e9): values closer than that become "
        "one (times in seconds, ids written as floats); subtract an offset in a Map (t - t0, "
        "or a time since the series' start), keep ids as int32 or int64, or jax.config.update("
        "'jax_enable_x64', True) before the loader", JaxloaderWarning,
        stacklevel=user_stacklevel())


_WARNED: set[str] = set()  # leaves warned of (by their path and what made them), this process
_LOOKS_LEFT = [256]  # float64 leaves ``warn_whole`` looks at in this process, at most


def as_32_bits(dtype: Any) -> str:
    """What JAX without x64 takes a 64-bit ``dtype`` as, and for a complex one, that its parts
    are what ``beyond_32_bits`` gave the range of (in words)."""
    kind = np.dtype(dtype).kind
    return {"i": "int32", "u": "uint32", "f": "float32"}.get(
        kind, "complex64 (its real and imaginary parts float32s)")


def what_32_bits_do(bounds: Any) -> str:
    """What JAX without x64 does to values beyond ``bounds`` (``beyond_32_bits``'), in words."""
    return "makes them infinite" if bounds.dtype.kind == "f" else "would wrap them"


_INT32, _UINT32 = np.iinfo(np.int32), np.iinfo(np.uint32)
# float32's largest finite value and half a step beyond it, the least a float64 that rounds to
# infinity (a tie rounds to even: up); 3.4028235e38, float32's maximum as NumPy prints it, is
# below, and rounds to the maximum
_ROUNDS_TO_INF = 2.0 ** 128 - 2.0 ** 103
_FLOAT32 = np.finfo(np.float32)


def memmap_under(array: np.ndarray) -> np.memmap | None:
    """The memory-mapped file ``array`` views (``np.load(mmap_mode=...)``, sliced, or its
    windows: ``sliding_window_view`` keeps the map behind an object of its own), or None: what
    a worker maps by its file, and what a cache's stamps name (``sources.fingerprint``)."""
    base: Any = array
    while base is not None:
        if type(base) is np.memmap and isinstance(base.filename, (str, os.PathLike)) \
                and base.base is not None:  # (np.load(pathlib.Path) keeps a Path)
            return base
        base = getattr(base, "base", None)
    return None


def byte_span(array: np.ndarray) -> tuple[int, int]:
    """The address of the lowest byte ``array``'s elements use and how many bytes they span."""
    start = end = array.__array_interface__["data"][0]
    for n, stride in zip(array.shape, array.strides):
        start, end = start + min(0, stride * (n - 1)), end + max(0, stride * (n - 1))
    return start, end - start + array.itemsize


def overlapping(array: np.ndarray) -> bool:
    """Whether ``array``'s elements share bytes (``sliding_window_view``'s windows, a
    ``broadcast_to``): a copy of its elements is larger than the bytes it views, up to a
    window's length times.

    Example:
        >>> windows = np.lib.stride_tricks.sliding_window_view(np.arange(100.0), 10)
        >>> overlapping(windows), overlapping(windows.copy()), overlapping(np.arange(3)[::2])
        (True, False, False)
    """
    return array.size > 0 and byte_span(array)[1] < array.nbytes


def span_bytes(array: np.ndarray) -> tuple:
    """An array of overlapping elements as the arguments of ``from_span``: the bytes it spans
    (a copy), its dtype, shape, first element's place in them and strides."""
    start, size = byte_span(array)
    first = array.__array_interface__["data"][0] - start
    return ctypes.string_at(start, size), array.dtype, array.shape, first, array.strides


def from_span(data: bytes, dtype: np.dtype, shape: tuple, first: int, strides: tuple) -> Any:
    """The read-only view ``span_bytes`` took apart.

    Example:
        >>> windows = np.lib.stride_tricks.sliding_window_view(np.arange(6), 3)
        >>> from_span(*span_bytes(windows)).tolist()
        [[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5]]
    """
    return np.ndarray(shape, dtype, buffer=data, offset=first, strides=strides)
