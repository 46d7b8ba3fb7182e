"""The copy a ``StreamLoader`` keeps of its batch maker, and the error where it cannot be made.

Each of a stream's readers reads its own copy of a shard, and ``peek()`` and
``load_state_dict()`` work on copies of the stream, with or without workers: a stream whose
shard, generator or transform holds what cannot be copied (an open connection, a file, a lock)
fails as the loader is made. The error names the part that failed (a shard by its name) and
where such things are opened instead.

Example:
    >>> import threading
    >>> import jaxloader as jl
    >>> class Rows:
    ...     def __init__(self): self.lock = threading.Lock()
    ...     def shard(self, n): return iter(range(n, n + 3))
    >>> try:
    ...     jl.StreamLoader(jl.Stream.from_generator(Rows().shard, shards=2), batch_size=2)
    ... except jl.JaxloaderError as e:
    ...     print(str(e)[:90])
    StreamLoader: cannot copy the shard Rows.shard[0]: TypeError: cannot pickle '_thread.lock'
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

from jaxloader.base.errors import ArgumentError

T = TypeVar("T")


def pristine(maker: T) -> T:
    """A copy of ``maker`` (``copy.deepcopy``), or an error naming what could not be copied."""
    try:
        return copy.deepcopy(maker)
    except Exception as e:  # noqa: BLE001 - any copy's failure: named below, then raised
        raise _uncopyable(e, maker) from e


def _uncopyable(e: Exception, maker: Any) -> ArgumentError:
    stream = maker.stream
    suspects: list[tuple[str, Any]] = [
        (f"shard {getattr(s, 'name', i)}", s) for i, s in enumerate(getattr(stream, "shards", ()))]
    suspects += [(f"transform {t!r:.60}", t)
                 for t in [*maker.record_transforms, *maker.batch_transforms]]
    name, error = f"stream ({stream!r:.80})", e
    for suspect, obj in suspects:
        try:
            copy.deepcopy(obj)
        except Exception as inner:  # noqa: BLE001 - the first part that fails is the one named
            name, error = suspect, inner
            break
    return ArgumentError(
        f"StreamLoader: cannot copy the {name}: {type(error).__name__}: {error}; "
        "each reader reads its own copy of a shard, and peek() and load_state_dict() copy the "
        "stream, with or without workers: open connections, files and locks in a shard's "
        "reset() or inside the generator function, not in the object they are made from")
