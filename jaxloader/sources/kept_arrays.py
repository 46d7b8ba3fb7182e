"""Arrays found once from a source's records and kept in a ``.npy`` file for the next run: a
``PackedSource``'s lengths, a ``FilteredSource``'s indices.

Beside the file, ``<file>.from`` says what the array was found from (the source's fingerprint
and, for a filter, its predicate's code digest). A file found from other data, or by another
predicate, is found again and saved over, with a warning: read back, it would give rows that
lost tokens or records the predicate no longer keeps, without a word. A file without its
``.from`` (written by the user, say) is read as it is.

Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "lengths.npy")
    >>> v1 = lambda: "data v1"  # (a source's fingerprint, say)
    >>> kept_or_found(path, lambda: np.array([3, 1]), v1)[0].tolist()  # found, then saved
    [3, 1]
    >>> kept_or_found(path, lambda: 1 / 0, v1)[0].tolist()  # read back: not found again
    [3, 1]
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable

import numpy as np

FROM = ".from"  # the suffix of the file that says what an array was found from


def kept_or_found(given: Any, find: Callable[[], Any],
                  found_from: Callable[[], str] | None = None, what: str = "source",
                  stacklevel: int = 3) -> tuple[Any, str | None]:
    """``(array, path)``: ``given`` itself, or when it is a path, the array in that file; when
    there is none yet, or the file was found from something other than ``found_from()`` says
    (asked only when there is a path: ``what`` it digests, for the warning), ``find()`` (saved
    to the path, if one was given). ``path`` is ``None`` when ``given`` is not a path (for
    messages); the warning is said at the caller ``stacklevel`` frames up."""
    path, source = None, None
    if isinstance(given, (str, os.PathLike)):
        path, given = os.fspath(given), None
        source = None if found_from is None else found_from()
        if os.path.exists(path):
            kept_from = _read_text(path + FROM)
            if source is None or kept_from is None or kept_from == source:
                given = np.load(path)
            else:
                warnings.warn(
                    f"{path} was not found from this run's {what} (the digest in {path + FROM} "
                    "is another's: the data or the code changed since): found again, and "
                    "saved over it", stacklevel=stacklevel)
    if given is None:
        given = find()
        if path is not None:
            _save(path, given, source)
    return given, path


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def _save(path: str, array: Any, found_from: str | None) -> None:
    """The array and what it was found from, each written whole or not at all (another process
    of the run may be reading the file as it is written)."""
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "wb") as f:
        np.save(f, array)
    os.replace(partial, path)
    if found_from is None:
        if os.path.exists(path + FROM):
            os.remove(path + FROM)  # (what it said is no longer this file's)
        return
    with open(partial, "w", encoding="utf-8") as f:
        f.write(found_from + "\n")
    os.replace(partial, path + FROM)
