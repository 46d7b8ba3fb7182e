"""A shard's ``get_state()`` as a reader keeps it: a copy taken as it is read, made JSON's types
when the reader's state is asked for.

A reader keeps where each window starts (a shard and its state) until the window's records are
all handed out, and a loader's ``state_dict()`` hands it on to be saved as JSON. The shard's
own dict may change as it reads on (a shard that keeps its place in a dict and returns that
dict), so the reader keeps a copy of it (``snapshot``, once a window: a record, without a
shuffle window): otherwise the saved start moves with the shard, and a restore skips
the records read since. A state that JSON cannot hold (a NumPy int, an array, a set) would
fail only at the checkpoint's save: ``plain`` makes NumPy scalars Python's and tuples lists,
and refuses the rest, naming the shard and the place, when the reader's state is asked for
(each batch).

Example:
    >>> import numpy as np
    >>> state = {"i": np.int64(2), "seen": (1, 2)}
    >>> plain(state, lambda: "r")
    {'i': 2, 'seen': [1, 2]}
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from jaxloader.base.errors import StateDictError
from jaxloader.base.state_copy import copied

__all__ = ["copied", "plain", "snapshot"]  # (copied: the reader's, for a shard's reset)

_SCALARS = (str, int, float, bool, type(None))
_PLAIN = frozenset(_SCALARS)  # (a set's lookup: the check made once a window)


def snapshot(shard: Any) -> Any:
    """A copy of ``shard.get_state()``: a flat dict's top level (numbers and strings, the
    usual state), else ``plain``'s, which is made anew (refused, naming the shard, where JSON
    cannot hold it); as it is from a shard whose state is made anew each time it is asked
    for (``fresh_state``: a Hugging Face dataset's)."""
    state = shard.get_state()
    if getattr(shard, "fresh_state", False):
        return state
    return dict(state) if _flat(state) else plain(state, lambda: shard.name)


def plain(state: Any, name: Callable[[], str]) -> dict | None:
    """``state`` (a snapshot) in JSON's types (dicts with string keys, lists, str, int,
    float, bool, None; tuples become lists and NumPy scalars Python's); ``None`` (a shard not
    started) as it is. ``name()`` names its shard in a refusal."""
    if state is None:
        return None
    if not isinstance(state, dict):
        raise StateDictError(
            f"stream shard {name()}: get_state() returned {type(state).__name__}, "
            "expected a dict of plain JSON (where the next record is: offsets, counts)")
    if _flat(state) and all(type(key) is str for key in state):
        return state  # (JSON's types already)
    return _plain(state, name, ())


def _flat(state: Any) -> bool:
    """Whether ``state`` is a dict of JSON's scalars (the usual state: offsets, counts), whose
    top level is then all a copy needs (its keys: ``plain``'s, once a batch, not a record's)."""
    if type(state) is not dict:
        return False
    scalars = _PLAIN
    for value in state.values():
        if type(value) not in scalars:
            return False
    return True


def _plain(value: Any, name: Callable[[], str], at: tuple) -> Any:
    """``value`` in JSON's types; ``at``: the keys and places leading to it (named only in a
    refusal)."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise _refused(name, (*at, key), f"a key of type {type(key).__name__}")
        return {k: _plain(v, name, (*at, k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, name, (*at, i)) for i, v in enumerate(value)]
    if isinstance(value, np.generic) and not isinstance(value, (np.datetime64, np.timedelta64,
                                                                np.void)):
        return _plain(value.item(), name, at)
    if isinstance(value, _SCALARS):  # a subclass (an IntEnum, a str's): its plain value
        return next(kind(value) for kind in (bool, int, float, str) if isinstance(value, kind))
    raise _refused(name, at, f"a {type(value).__name__}")


def _refused(name: Callable[[], str], at: tuple, what: str) -> StateDictError:
    where = "".join(f"[{k!r}]" for k in at) or "itself"
    return StateDictError(
        f"stream shard {name()}: get_state() {where} is {what}, which a checkpoint cannot keep "
        "as JSON; return plain JSON from get_state() (dicts with string keys, lists, str, int, "
        "float, bool, None), e.g. int(n) for a NumPy int, a list for an array")
