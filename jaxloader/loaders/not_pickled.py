"""A loader does not pickle: it holds worker processes, threads, pipes and open files, which
another process cannot take over. Pickled to a ``spawn`` or ``forkserver`` process (the default
start method on macOS, and on Linux from Python 3.14), or deep-copied, it said only
``cannot pickle '_thread.RLock' object``; it now says what to do instead.

Example:
    >>> import pickle, jaxloader as jl
    >>> try:
    ...     pickle.dumps(jl.DataLoader([1, 2, 3, 4], batch_size=2))
    ... except jl.JaxloaderError as e:
    ...     print(str(e)[:58])
    DataLoader does not pickle (it holds worker processes, thr
"""

from __future__ import annotations

from typing import NoReturn

from jaxloader.base.errors import JaxloaderError


class NotPickled:
    """A class whose objects refuse to be pickled or copied, saying why and what to do."""

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        kind = type(self).__name__
        raise JaxloaderError(
            f"{kind} does not pickle (it holds worker processes, threads, pipes and open "
            f"files, which another process cannot take over), nor copy: make the {kind} in "
            "the process that reads it (pass a multiprocessing.Process a function that makes "
            "it, or its source and arguments), or a new one for a copy; a forked child "
            "leaves its parent's loader alone")
