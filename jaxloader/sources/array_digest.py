"""``arrays_digest``: the NumPy arrays a transform's function holds, digested by their values.

``code_digest`` reads a value by its ``repr``, as every process writes it, which summarises a
large array: a change deep in a large table a transform closes over is not in it. A state names
its transforms with both (``loaders.transform_names.transforms_of``), so that a restore under
another table is warned of.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import itertools
import mmap
import types
from typing import Any

import numpy as np

from jaxloader.base.columns import spaced_values
from jaxloader.sources.code_digest import filled
from jaxloader.sources.value_text import ATOMIC, attributes_of


WHOLE_BYTES = 64 << 20  # the arrays read whole, together; past them each is sampled:
SAMPLE_BYTES = 8 << 20  # this many bytes of its values, evenly spaced
MOST_VALUES = 20_000  # the values looked at (a vocabulary of a million words is not walked)


def arrays_digest(fn: Any) -> str:
    """A digest of the bytes of the NumPy arrays ``fn`` holds (its closure's and default
    arguments', a partial's arguments', a callable's attributes', a bound method's object's,
    and theirs, in tuples, lists and dicts, 4 levels down; not a memory-mapped file's), ``""``
    where none (``code_digest`` reads an array by its ``repr``'s first characters). The first
    ``WHOLE_BYTES`` of arrays are read whole, each after them by ``SAMPLE_BYTES`` of its values,
    evenly spaced; the first ``MOST_VALUES`` values found are looked at.

    Example:
        >>> scaled, table = (lambda t: lambda r: r * t), np.ones(1000)  # (a closure over t)
        >>> before = arrays_digest(scaled(table))
        >>> table[-1] = 5.0
        >>> arrays_digest(scaled(table)) == before, arrays_digest(abs)
        (False, '')
    """
    digest, todo, found = hashlib.blake2b(digest_size=16), [(fn, 0)], False
    seen: set[int] = set()
    whole = WHOLE_BYTES  # (read whole until this many bytes; then a sample of each)
    while todo and len(seen) < MOST_VALUES:
        value, depth = todo.pop()
        if id(value) in seen or depth > 4 or isinstance(value, (type, types.ModuleType)):
            continue
        seen.add(id(value))
        inside: list = []
        if isinstance(value, np.ndarray):
            if not value.dtype.hasobject and not _mapped(value):
                digest.update(f"{value.dtype}{value.shape}".encode())
                if value.nbytes <= whole:
                    digest.update(_bytes(value))
                    whole -= value.nbytes
                else:  # (a trainer's data, which the object of its augment method holds, is
                    # not read whole at the first state_dict(): evenly spaced values, any layout)
                    digest.update(_bytes(spaced_values(value, SAMPLE_BYTES // value.itemsize)))
                found = True
        elif isinstance(value, (tuple, list, dict)):  # (their first MOST_VALUES items)
            inside = [v for v in itertools.islice(value.values() if isinstance(value, dict)
                                                  else value, MOST_VALUES)
                      if type(v) not in ATOMIC]
        elif isinstance(value, functools.partial):
            inside = [value.func, *value.args, *value.keywords.values()]
        else:
            try:  # (an object's __getattr__ of the user's that raises KeyError: left out)
                inside = _held(value, depth)
            except Exception:  # noqa: BLE001
                inside = []
        todo += [(v, depth + 1) for v in reversed(inside)]
    return digest.hexdigest() if found else ""


def _bytes(array: np.ndarray) -> memoryview:
    """``array``'s bytes in C order, as a buffer of bytes: a datetime64's buffer cannot be
    exported as its own dtype (the digest raised ``ValueError`` on a closure over one)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def _mapped(array: np.ndarray) -> bool:
    """Whether ``array`` is a view of a memory-mapped file (read whole, it would be read)."""
    base: Any = array
    while base is not None and not isinstance(base, (np.memmap, mmap.mmap)):
        base = getattr(base, "base", None)
    return base is not None


def _held(value: Any, depth: int) -> list:
    """What a function (its closure, bound object and defaults) or an object (its attributes)
    below the first holds."""
    if not (callable(value) or depth and hasattr(value, "__dict__")):
        return []
    inside = [cell.cell_contents for cell in getattr(value, "__closure__", None) or ()
              if filled(cell)] + [getattr(value, "__self__", None)]
    inside += [*(getattr(value, "__defaults__", None) or ()),  # (lambda r, t=table:)
               *(getattr(value, "__kwdefaults__", None) or {}).values()]
    if not inspect.isroutine(value):
        inside += list(attributes_of(value).values())
    return inside
