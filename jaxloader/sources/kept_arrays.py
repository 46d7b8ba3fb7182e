"""Arrays found once from a source's records and kept in a ``.npy`` file for the next run: a
``PackedSource``'s lengths, a ``FilteredSource``'s indices.

Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "lengths.npy")
    >>> kept_or_found(path, lambda: np.array([3, 1]))[0].tolist()  # found, then saved
    [3, 1]
    >>> kept_or_found(path, lambda: 1 / 0)[0].tolist()  # read back: nothing found again
    [3, 1]
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np


def kept_or_found(given: Any, find: Callable[[], Any]) -> tuple[Any, str | None]:
    """``(array, path)``: ``given`` itself, or when it is a path, the array in that file; when
    there is none yet, ``find()`` (saved to the path, if one was given). ``path`` is ``None``
    when ``given`` is not a path (for messages)."""
    path = None
    if isinstance(given, (str, os.PathLike)):
        path, given = os.fspath(given), None
        if os.path.exists(path):
            given = np.load(path)
    if given is None:
        given = find()
        if path is not None:
            np.save(path, given)
    return given, path
