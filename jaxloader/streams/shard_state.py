"""A shard's ``get_state()`` as a reader keeps it: a copy in JSON's types, taken as it is read.

A reader keeps where each window starts (a shard and its state) until the window's records are
all handed out, and a loader's ``state_dict()`` hands it on to be saved as JSON. The shard's
own dict may change as it reads on (a shard that keeps its place in a dict and returns that
dict), so the reader keeps a copy: otherwise the saved start moves with the shard, and a
restore skips the records read since. And a state that JSON cannot hold (a NumPy int, an
array, a set) would fail only at the checkpoint's save; NumPy scalars are made Python's, the
rest is refused here, naming the shard and the place.

Example:
    >>> import numpy as np
    >>> from jaxloader.streams.iterable_shards import IterableShard
    >>> shard = IterableShard(lambda: range(3), name="r")
    >>> shard.get_state = lambda: {"i": np.int64(2), "seen": (1, 2)}
    >>> plain_state(shard)
    {'i': 2, 'seen': [1, 2]}
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxloader.base.errors import StateDictError

_SCALARS = (str, int, float, bool, type(None))


def plain_state(shard: Any) -> dict:
    """A copy of ``shard.get_state()`` in JSON's types (dicts with string keys, lists, str,
    int, float, bool, None; tuples become lists and NumPy scalars Python's)."""
    state = shard.get_state()
    if not isinstance(state, dict):
        raise StateDictError(
            f"stream shard {shard.name}: get_state() returned {type(state).__name__}, "
            "expected a dict of plain JSON (where the next record is: offsets, counts)")
    return _plain(state, shard.name, "")


def _plain(value: Any, name: str, where: str) -> Any:
    if type(value) in _SCALARS:
        return value
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise _refused(name, f"{where}[{key!r}]", f"a key of type {type(key).__name__}")
        return {k: _plain(v, name, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, name, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, np.generic) and not isinstance(value, (np.datetime64, np.timedelta64,
                                                                np.void)):
        return _plain(value.item(), name, where)
    if isinstance(value, _SCALARS):  # a subclass (an IntEnum, a str's): its plain value
        return next(kind(value) for kind in (bool, int, float, str) if isinstance(value, kind))
    raise _refused(name, where or "itself", f"a {type(value).__name__}")


def _refused(name: str, where: str, what: str) -> StateDictError:
    return StateDictError(
        f"stream shard {name}: get_state() {where} is {what}, which a checkpoint cannot keep "
        "as JSON; return plain JSON from get_state() (dicts with string keys, lists, str, int, "
        "float, bool, None), e.g. int(n) for a NumPy int, a list for an array")
