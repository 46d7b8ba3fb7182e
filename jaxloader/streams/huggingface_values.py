"""A Hugging Face stream's records in Python format as a ``Dataset``'s batch (``plan_of`` the
features once, ``as_declared`` each record): lists of numbers as arrays of the declared dtype,
numbers of it, dates and times ``datetime64``/``timedelta64``, a list of strings an object
array, a list of images, structs or lists one leaf (stacked where its items are arrays of one
shape), nulls refused naming the field.

Example:
    >>> import datasets
    >>> plan = plan_of(datasets.Features({"v": datasets.Sequence(datasets.Value("float32"))}))
    >>> as_declared({"v": [0.5, 1.0]}, plan)["v"].dtype
    dtype('float32')
"""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np

from jaxloader.base.columns import object_column
from jaxloader.base.errors import RecordError
from jaxloader.sources.huggingface import _declared_dtype
from jaxloader.streams.json_values import numbers_as_arrays


def plan_of(features: Any) -> Any:
    """What ``as_declared`` does with each field of ``features`` (a ``Features`` dict),
    worked out once: a dict of fields' plans for a struct, the declared NumPy dtype of a
    number or of a list's numbers (or of a time), ``_STRINGS`` for a list of strings, a
    ``Listed`` for a list of other items (images, structs, lists), ``None`` for the rest
    (strings, images)."""
    if isinstance(features, dict):
        return {key: plan_of(feature) for key, feature in features.items()}
    inner = getattr(features, "feature", None)  # List / Sequence / LargeList
    if str(getattr(inner, "dtype", "")) in _TEXT:
        return _STRINGS
    declared = _declared_dtype(features)  # (tested for None: NumPy 1.x took a dtype with no
    # fields as false)
    if declared is None and inner is not None:  # a list of images, structs, lists of strings
        return Listed(plan_of(inner))
    return declared if declared is not None else _time_dtype(features)


class Listed:
    """The plan of a list feature whose items are not numbers (images, structs, lists of
    strings, times): ``inner``, its items' plan; its value one leaf (``_listed``)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner


def _time_dtype(feature: Any) -> np.dtype | None:
    """``datetime64``/``timedelta64`` for a ``Value`` of Arrow's ``timestamp[unit]``,
    ``date32``/``date64``, ``duration[unit]`` or ``time32/64[unit]`` (since midnight, as
    ``ParquetSource`` gives them; a ``Dataset`` in NumPy format gives these; Python format
    gives ``datetime`` objects, which do not batch)."""
    kind = str(getattr(feature, "dtype", ""))
    unit = kind[kind.find("[") + 1:].split(",")[0].rstrip("]") if "[" in kind else ""
    if kind.startswith("timestamp[") and unit in ("s", "ms", "us", "ns"):
        return np.dtype(f"datetime64[{unit}]")
    if kind.startswith(("duration[", "time32[", "time64[")) and unit in ("s", "ms", "us", "ns"):
        return np.dtype(f"timedelta64[{unit}]")  # (a time of day: since midnight)
    return {"date32": np.dtype("datetime64[D]"), "date64": np.dtype("datetime64[ms]")}.get(kind)


class _Plan:
    """A plan that is not a dtype: one object in every process (unpickled by its name)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> str:
        return self.name


_UNKNOWN = _Plan("_UNKNOWN")  # a field the features do not name
_STRINGS = _Plan("_STRINGS")  # a list of strings (or bytes): an object array a row
_TEXT = ("string", "large_string", "binary", "large_binary")
_PYTHON = {int: np.dtype(np.int64), float: np.dtype(np.float64), bool: np.dtype(np.bool_)}


def _holds_none(value: list) -> bool:
    """Whether a ``None`` is among a list's items, through lists of lists."""
    if value and type(value[0]) is list:
        return any(v is None or type(v) is list and _holds_none(v) for v in value)
    return None in value


def as_declared(value: Any, plan: Any, name: str = "a record") -> Any:
    """A record in Python format with its lists of numbers as arrays and its numbers of the
    dtypes declared (``plan``, from ``plan_of``; ``_UNKNOWN``: lists of numbers as
    ``JsonlShard`` reads them); strings and other leaves as they are.

    Example:
        >>> import datasets
        >>> plan = plan_of(datasets.Features({"v": datasets.Sequence(datasets.Value("float32")),
        ...                                   "n": datasets.Value("int16")}))
        >>> record = as_declared({"v": [0.5, 1.0], "n": 3}, plan)
        >>> record["v"].dtype, record["n"].dtype
        (dtype('float32'), dtype('int16'))
    """
    if value is None and plan is not None and plan is not _UNKNOWN:  # (a struct, a number,
        raise RecordError(  # a list: a batch of it and of values changed its structure, or
            f"{name}: a null (None) where the features declare "  # made NaN; refused as
            f"{_declared(plan)}; fill the nulls (ds.map) or drop those rows (ds.filter) "
            "before streaming")  # a Dataset's is)
    if type(plan) is dict:
        if type(value) is not dict:
            return numbers_as_arrays(value)
        return {key: as_declared(v, plan.get(key, _UNKNOWN), f"{name}[{key!r}]")
                for key, v in value.items()}
    if plan is _UNKNOWN:
        return numbers_as_arrays(value)
    kind = type(value)
    if isinstance(plan, Listed):
        return _listed(value, plan.inner, name) if kind is list else value
    if kind is list and (plan is _STRINGS or isinstance(plan, np.dtype)) and _holds_none(
            value):  # (NumPy made it NaN, or False; an int list's became a list: the batch's
        raise RecordError(  # structure changed; refused as a Dataset's is)
            f"{name}: a list of {'strings' if plan is _STRINGS else plan} holds a null (None): "
            f"{value!r:.80}; fill the nulls (ds.map) or drop those rows (ds.filter) before "
            "streaming")
    if plan is _STRINGS:
        return object_column(value) if kind is list else value
    if kind is list:
        if plan is not None:
            try:
                return np.asarray(value, plan)
            except (TypeError, ValueError):  # (an object array of them in one record and an
                raise RecordError(  # array in the next changed the batch's kind)
                    f"{name}: lists of {plan} that make no one array ({value!r:.80}: lists of "
                    "other lengths in one record); pad them to one length in a Map, or read "
                    "the Dataset with a DataLoader, which gives each row's as an object "
                    "array") from None
        return numbers_as_arrays(value)
    # a Python number batches as int64, float64 or bool: cast only to another dtype
    if plan is not None and kind in _PYTHON and _PYTHON[kind] != plan:
        return plan.type(value)
    if isinstance(value, datetime.time) and isinstance(plan, np.dtype):  # (since midnight)
        return np.timedelta64(((value.hour * 60 + value.minute) * 60 + value.second)
                              * 1_000_000 + value.microsecond, "us").astype(plan)
    if isinstance(value, (datetime.date, datetime.timedelta)) and isinstance(plan, np.dtype):
        if isinstance(value, datetime.datetime) and value.tzinfo is not None:
            value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)  # as Arrow
        return np.array(value, dtype=plan)[()]
    return value


def _listed(value: list, inner: Any, name: str) -> Any:
    """A list feature's value (of images, structs, lists of strings, times) as one leaf, as a
    ``Dataset``'s row is: its items stacked where they are arrays of one shape and dtype
    (images of one size), else an object array of them. A Python list is a pytree node: a
    batch of them was transposed, its row ``i`` holding item ``i`` of every record."""
    if isinstance(inner, np.dtype) and not any(  # (times: at once, not an item at a time)
            v is None or isinstance(v, datetime.time) or getattr(v, "tzinfo", None) is not None
            for v in value):
        return np.array(value, inner)  # (of no items: an empty one of the dtype, not objects)
    items = [as_declared(v, inner, f"{name}[{i}]") for i, v in enumerate(value)]
    arrays = [v if isinstance(v, np.ndarray) else np.asarray(v) for v in items if isinstance(
        v, (np.ndarray, np.generic)) or hasattr(v, "__array_interface__")]  # (PIL images)
    if items and len(arrays) == len(items) and not any(a.dtype.hasobject for a in arrays) and (
            len({(a.shape, a.dtype) for a in arrays}) == 1):
        return np.stack(arrays)  # (lists of strings not: a record's of one length, another's
    return object_column(items)  # of others, would be of other ranks)


def _declared(plan: Any) -> str:
    """What a plan's feature holds, for a message."""
    if isinstance(plan, dict):
        return f"a struct of {sorted(plan)}"
    if isinstance(plan, Listed) or plan is _STRINGS:
        return "a list"
    return f"{plan}"
