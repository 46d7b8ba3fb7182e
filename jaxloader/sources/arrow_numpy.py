"""An Arrow array as NumPy: numbers as views of Arrow's buffers, times of day as ``timedelta64``
since midnight (at any depth of lists and structs), and a list array of no rows as the array its
type says. ``arrow_columns`` decodes row groups' columns with them.

Example:
    >>> import pyarrow as pa
    >>> numpy_of(pa.array([1, 2], pa.int32())).tolist(), no_rows(pa.list_(pa.int8(), 3)).shape
    ([1, 2], (0, 3))
"""

from __future__ import annotations

from typing import Any

import numpy as np


def is_list(kind: Any) -> bool:
    """Whether an Arrow type is a list (of any length, fixed or not, 32- or 64-bit offsets)."""
    import pyarrow as pa

    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or (
        pa.types.is_fixed_size_list(kind))


def numpy_of(array: Any) -> np.ndarray:
    """An Arrow array as NumPy: numbers without nulls as a view of Arrow's buffer, times of day
    as ``timedelta64`` since midnight. Arrow's own ``to_numpy`` imports pandas where it is
    installed (tens of MiB more in every worker), so it is left for the other types
    (booleans, dates)."""
    import pyarrow as pa

    kind = array.type
    if pa.types.is_time(kind):  # (a time of day, since midnight: Arrow's own gives
        ints = numpy_of(array.view(pa.int32() if pa.types.is_time32(kind) else pa.int64()))
        return ints.astype(np.int64).view(f"timedelta64[{kind.unit}]")  # datetime.time)
    if array.null_count == 0 and (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        code = ("f" if pa.types.is_floating(kind) else "i" if pa.types.is_signed_integer(kind)
                else "u")
        dtype = np.dtype(f"<{code}{kind.bit_width // 8}")
        return np.frombuffer(array.buffers()[1], dtype, count=len(array),
                             offset=array.offset * dtype.itemsize)
    return np.asarray(_times_as_durations(array).to_numpy(zero_copy_only=False))


def _with_times(kind: Any, time32: Any, time64: Any) -> Any:
    """``kind`` with each time of day inside its lists and structs made ``time32(unit)`` or
    ``time64(unit)``; ``None`` where it holds none."""
    import pyarrow as pa

    if pa.types.is_time(kind):
        return (time32 if pa.types.is_time32(kind) else time64)(kind.unit)
    if pa.types.is_struct(kind):
        fields = [kind.field(i) for i in range(kind.num_fields)]
        kinds = [_with_times(field.type, time32, time64) for field in fields]
        return None if all(k is None for k in kinds) else pa.struct(
            [field.with_type(field.type if k is None else k) for field, k in zip(fields, kinds)])
    if is_list(kind):
        inner = _with_times(kind.value_field.type, time32, time64)
        if inner is None:
            return None
        field = kind.value_field.with_type(inner)
        return (pa.list_(field, kind.list_size) if pa.types.is_fixed_size_list(kind) else
                pa.large_list(field) if pa.types.is_large_list(kind) else pa.list_(field))
    return None


def _times_as_durations(array: Any) -> Any:
    """``array`` with its times of day inside lists and structs as durations since midnight,
    which become ``timedelta64`` as the top-level ones do (Arrow's own gives ``datetime.time``
    objects there): the same buffers seen as integers, ``time32``'s widened to 64 bits."""
    import pyarrow as pa

    ints = _with_times(array.type, lambda unit: pa.int32(), lambda unit: pa.int64())
    if ints is None:
        return array
    wide = _with_times(array.type, lambda unit: pa.int64(), lambda unit: pa.int64())
    return array.view(ints).cast(wide).view(_with_times(array.type, pa.duration, pa.duration))


def no_rows(kind: Any) -> np.ndarray | None:
    """A list array of no rows (the values of a row group whose lists are all empty) as the
    array its type says: the leaf's dtype, a fixed-size list's length, 0 for a list's of any
    (not Python objects, nor a fixed-size list's crash on its missing offsets: ``Pad`` gives
    an empty leaf the others' trailing shape); ``None`` for strings or structs (as before)."""
    import pyarrow as pa

    shape = [0]
    while is_list(kind):
        shape.append(kind.list_size if pa.types.is_fixed_size_list(kind) else 0)
        kind = kind.value_type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)
            or pa.types.is_boolean(kind) or pa.types.is_temporal(kind)):
        return None
    out = np.empty(shape, numpy_of(pa.array([], kind)).dtype)
    out.flags.writeable = False
    return out


_UTC = {"UTC", "UCT", "Universal", "Zulu", "GMT", "GMT0", "GMT+0", "GMT-0", "Greenwich", "Z",
        "+00:00", "-00:00", "+0000", "-0000"}  # (the zones whose offset is always 0)


def zone_in(kind: Any) -> str | None:
    """The zone, other than UTC's, of a timestamp type ``kind`` holds at any depth (in lists,
    structs, maps); ``None`` where none (UTC's instants are NumPy's datetime64 exactly).

    Example:
        >>> import pyarrow as pa
        >>> zone_in(pa.list_(pa.timestamp("us", tz="Europe/Paris"))), zone_in(pa.timestamp("s"))
        ('Europe/Paris', None)
    """
    import pyarrow as pa

    if isinstance(kind, pa.BaseExtensionType):  # (its own value_type may be anything:
        kind = kind.storage_type                # Hugging Face's Array2D has a dtype's name)
    if pa.types.is_timestamp(kind):
        return None if kind.tz is None or kind.tz.removeprefix("Etc/") in _UTC else kind.tz
    if pa.types.is_struct(kind):
        inner = [kind.field(i).type for i in range(kind.num_fields)]
    elif pa.types.is_map(kind):
        inner = [kind.key_type, kind.item_type]
    elif hasattr(kind, "value_type"):  # (lists of any kind, a dictionary's values)
        inner = [kind.value_type]
    else:
        return None
    return next((z for k in inner if (z := zone_in(k)) is not None), None)
