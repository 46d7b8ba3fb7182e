"""``arrays_digest``: the NumPy arrays a transform's function holds, digested by their values.

``code_digest`` reads a value by its ``repr``'s first 200 characters, as every process writes
it: a change deep in a large table a transform closes over is not in them. A state names its
transforms with both (``loaders.state.transforms_of``), so that a restore under another table
is warned of.
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

from jaxloader.sources.code_digest import _ATOMIC, _attributes, filled


def arrays_digest(fn: Any) -> str:
    """A digest of the bytes of the NumPy arrays ``fn`` holds (its closure's, a partial's
    arguments', a callable's attributes', a bound method's object's, and theirs, in tuples,
    lists and dicts, 4 levels down; not a memory-mapped file's; one past 64 MiB by 8 MiB of
    its values, evenly spaced), ``""`` where none (``code_digest`` reads an array by its
    ``repr``'s first characters). A container's first 100,000 items are looked at.

    Example:
        >>> scaled, table = (lambda t: lambda r: r * t), np.ones(1000)  # (a closure over t)
        >>> before = arrays_digest(scaled(table))
        >>> table[-1] = 5.0
        >>> arrays_digest(scaled(table)) == before, arrays_digest(abs)
        (False, '')
    """
    digest, seen, todo, found = hashlib.blake2b(digest_size=16), set(), [(fn, 0)], False
    while todo:
        value, depth = todo.pop()
        if id(value) in seen or depth > 4 or isinstance(value, (type, types.ModuleType)):
            continue
        seen.add(id(value))
        inside: list = []
        if isinstance(value, np.ndarray):
            if not value.dtype.hasobject and not _mapped(value):
                digest.update(f"{value.dtype}{value.shape}".encode())
                # past 64 MiB, a sample of its rows (a trainer's data, which the object of its
                # augment method holds, is not read whole at the first state_dict())
                rows = value.reshape(1) if not value.ndim else value
                step = -(-value.nbytes // (8 << 20)) if value.nbytes > 64 << 20 else 1
                digest.update(np.ascontiguousarray(rows[::step]).data)
                found = True
        elif isinstance(value, (tuple, list, dict)):  # (their first 100,000 items)
            inside = [v for v in itertools.islice(value.values() if isinstance(value, dict)
                                                  else value, 100_000) if type(v) not in _ATOMIC]
        elif isinstance(value, functools.partial):
            inside = [value.func, *value.args, *value.keywords.values()]
        elif callable(value) or depth and hasattr(value, "__dict__"):
            inside = [cell.cell_contents for cell in getattr(value, "__closure__", None) or ()
                      if filled(cell)] + [getattr(value, "__self__", None)]
            if not inspect.isroutine(value):
                inside += list(_attributes(value).values())
        todo += [(v, depth + 1) for v in reversed(inside)]
    return digest.hexdigest() if found else ""


def _mapped(array: np.ndarray) -> bool:
    """Whether ``array`` is a view of a memory-mapped file (read whole, it would be read)."""
    base: Any = array
    while base is not None and not isinstance(base, (np.memmap, mmap.mmap)):
        base = getattr(base, "base", None)
    return base is not None
