"""Where NumPy's and Python's global random generators are (``draws``): a draw moves them, so a
function that drew from them, where the loader's numbers were meant, is found by asking before
and after it (``batching.global_draws`` watches transforms so, ``sources.mapped`` its function).

Example:
    >>> before = draws()
    >>> _ = np.random.random()
    >>> draws() != before
    True
"""

from __future__ import annotations

import inspect
import random
import warnings
from typing import Any

import numpy as np

from jaxloader.base.errors import JaxloaderWarning


def draws() -> tuple | None:
    """Where NumPy's and Python's global generators are (a draw moves them); ``None`` where
    that cannot be asked."""
    try:
        numpy = np.random.get_state(legacy=False)  # (a dict for every bit generator, with
        python = random.getstate()  # the legacy Gaussian that every other normal() takes)
    except Exception:  # noqa: BLE001 - (a watch only: nothing to say then)
        return None
    return brief(numpy), python[1][0], python[1][-1], python[2]


def brief(value: Any) -> Any:
    """A state's values, an array by its size and ends (MT19937's position moves each draw,
    its key each 624)."""
    if isinstance(value, dict):
        return tuple((key, brief(item)) for key, item in value.items())
    if isinstance(value, np.ndarray):
        return (value.size, value.flat[0].item(), value.flat[-1].item()) if value.size else ()
    return value


def warn_at(fn: Any, text: str, default: str) -> None:
    """Warns ``text`` at the line of ``fn``'s code (a partial's function's; a worker has no
    frame of the user's, and the relay says it there), or at ``default`` where it has none."""
    fn = inspect.unwrap(getattr(fn, "func", fn))
    code = getattr(fn, "__code__", None)
    warnings.warn_explicit(text, JaxloaderWarning, code.co_filename if code else default,
                           code.co_firstlineno if code else 0)
