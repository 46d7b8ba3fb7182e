"""JSON values as a loader batches them: lists of numbers as NumPy arrays (a Python list is a
pytree node: ``"tokens": [5, 8, 13]`` would batch as 3 arrays of one number a record), for
JSON lines files and the Python-format records of a Hugging Face stream.

Example:
    >>> numbers_as_arrays({"t": [5, 8], "w": ["a"], "id": [2**63]})
    {'t': array([5, 8]), 'w': ['a'], 'id': [9223372036854775808]}
"""

from __future__ import annotations

from typing import Any

import numpy as np


def numbers_as_arrays(value: Any) -> Any:
    """JSON's lists of numbers (at any depth, of one length a depth) as NumPy arrays; other
    lists (of strings, of objects, of lists of other lengths) as lists of converted items, and
    so are ints beyond int64, which NumPy would make floats, rounded: Python ints are exact (a
    ``Map`` can make them uint64; collation refuses them, naming them)."""
    if isinstance(value, dict):
        return {key: numbers_as_arrays(v) for key, v in value.items()}
    if not isinstance(value, list):
        return value
    if value and _all_numbers(value):
        try:
            array = np.asarray(value)
        except ValueError:  # lists of other lengths
            array = None
        if array is not None and (array.dtype.kind in "bi" or array.dtype.kind == "f"
                                  and _has_float(value) and not _has_big_int(value)):
            return array  # (uint64 or float64 from ints of 2**63 up: kept Python ints)
    return [numbers_as_arrays(v) for v in value]


def _has_float(value: list) -> bool:
    """Whether a float is among the numbers of ``value`` (through nested lists)."""
    return any(_has_float(v) if isinstance(v, list) else type(v) is float for v in value)


def _has_big_int(value: list) -> bool:
    """Whether an int beyond int64 is among the numbers of ``value`` (through nested lists)."""
    return any(_has_big_int(v) if isinstance(v, list) else
               type(v) is int and not -2**63 <= v < 2**63 for v in value)


_NUMBERS = {int, float, bool}


def _all_numbers(value: list) -> bool:
    """Whether the list's leaves (through nested lists) are numbers, looking at every item of
    every innermost list; a ``ValueError`` where they hold booleans among their numbers
    (``[1, true]`` became ``[1, 1]``), one inner list's beside another's too (``[[1], [true]]``:
    each looked at alone, they became ``[[1], [1]]``), or nulls."""
    kinds: set[type] = set()
    if not _kinds_inside(value, kinds):
        return False
    if type(None) in kinds and len(kinds) > 1 and kinds - {type(None)} <= _NUMBERS:
        raise ValueError(f"a list holds null among its numbers ({value[:8]!r:.80}), which no "
                         "array of numbers holds (as a list, its batch would change shape): "
                         "write a number for it (NaN as a float, or a fill value) and, where "
                         "it matters, a mask beside it")
    if bool in kinds and len(kinds) > 1 and kinds <= _NUMBERS:
        raise ValueError(f"a list mixes true/false with numbers ({value[:8]!r:.80}), which "
                         "NumPy would make all numbers: write 0 and 1, or one kind a list")
    return kinds <= _NUMBERS


def _kinds_inside(value: list, kinds: set[type]) -> bool:
    """Adds the types of the items of ``value``'s innermost lists to ``kinds``; ``False``
    where its lists of lists are not of one length a depth (no one array: each inner list is
    then looked at alone, as converted alone) or hold something else than lists."""
    if isinstance(value[0], list):
        deeper = bool(value[0]) and isinstance(value[0][0], list)  # (one depth for all)
        return all(isinstance(v, list) and len(v) == len(value[0]) and v and
                   isinstance(v[0], list) == deeper and _kinds_inside(v, kinds) for v in value)
    kinds.update(map(type, value))
    return True
