"""Shards whose records come from Python code: ``IterableShard`` (a generator function, a
simulator: ``Stream.from_generator``) and ``MappedShard`` (a shard's records through a function:
``Stream.map``).

A generator that fills one array (or dict) and yields it again changes the records read before
it, which wait in a batch or a shuffle window: every one of them then holds the last values. An
``IterableShard`` warns where one of the first records after a start holds the very array
(or is the very dict or list) its record before held, changed since that record was read (a
constant shared by every record is not changed: no warning).

Example:
    >>> shard = IterableShard(lambda: iter(range(5)), name="numbers")
    >>> shard.reset({"consumed": 3}); shard.next(), shard.get_state()
    (3, {'consumed': 4})
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from jaxloader.base.abilities import close_of
from jaxloader.base.errors import ConfigError, StateDictError
from jaxloader.sources.fingerprint import code_digest
from jaxloader.streams.shards import state_ints

_CHECKED = 64  # the first records after each start that are checked for a refilled buffer

class Bound:
    """``make(i)`` as a function of nothing (picklable where ``make`` is)."""

    def __init__(self, make: Callable[[int], Iterable], index: int) -> None:
        self.make, self.index = make, index

    def __call__(self) -> Iterable:
        return self.make(self.index)


class IterableShard:
    """Records of ``make()`` (a function returning an iterable: a generator function, a
    simulator's reset); a list or other re-iterable object is accepted as it is. Resumes by
    skipping the records already read: O(n) in them.

    A generator object itself cannot start again, so it is refused: pass the function that
    makes it (``IterableShard(lambda: my_generator(...))``).
    """

    def __init__(self, make: Callable[[], Iterable] | Iterable, name: str | None = None) -> None:
        if callable(make):
            self._make = make
        elif isinstance(make, Iterable) and iter(make) is not make:  # re-iterable (a list)
            self._make = lambda: make
        else:
            raise ConfigError(
                f"IterableShard: got a {type(make).__name__}, an iterator that cannot start "
                "again (for workers, for a restore, for the next epoch); pass the function that "
                "makes it, e.g. IterableShard(lambda: my_generator(...))"
            )
        self.name: str = name or str(getattr(make, "__qualname__", type(make).__name__))
        self._it: Iterator | None = None
        self._consumed = 0
        self._last: Any = None  # the record read before, and a copy (a refilled buffer)
        self._warned = False

    def reset(self, state: dict | None = None) -> None:
        (skip,) = state_ints(self, state, ("consumed",))
        made = self._make()
        try:
            self._it = iter(made)
        except TypeError:
            raise ConfigError(
                f"IterableShard {self.name}: its function returned {type(made).__name__} "
                f"{made!r:.60}, expected an iterable of records; yield the records (a "
                "generator function) or return a list or an iterator (a missing `return`?)"
            ) from None
        self._consumed, self._last = 0, None
        for _ in range(skip):
            try:
                next(self._it)
            except StopIteration:
                raise StateDictError(
                    f"IterableShard {self.name}: the state says {skip} records were read, but "
                    f"it ends after {self._consumed}; it must make the same records each time"
                ) from None
            self._consumed += 1

    def next(self) -> Any:
        if self._it is None:
            self.reset(None)
        assert self._it is not None
        record = next(self._it)
        self._consumed += 1
        if self._consumed <= _CHECKED:  # (a buffer refilled is refilled from the first record)
            self._check_new(record)
        return record

    def _check_new(self, record: Any) -> None:
        """Warns once where ``record`` holds the very array its record before held (or is that
        very dict or list), changed since that record was read: a buffer refilled."""
        where = None if self._last is None else _refilled(record, *self._last)
        self._last = (record, _held(record)) if self._consumed < _CHECKED else None
        if where is not None and not self._warned:
            self._warned = True
            warnings.warn(
                f"IterableShard {self.name}: record {self._consumed - 1}{where} is the very "
                "object the record before it held: a generator that refills one buffer and "
                "yields it again changes the records already read (they wait in a batch or a "
                "shuffle window: each would hold the last values); yield a new array each time "
                "(a copy: buf.copy())", stacklevel=2)

    def get_state(self) -> dict:
        return {"consumed": self._consumed}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_it": None, "_consumed": 0, "_last": None}


class MappedShard:
    """``shard``'s records through ``fn`` (``Stream.map``); its state is the shard's, its name
    the shard's and the function's code digest (``sources.fingerprint.code_digest``), so a
    stream state saved under another function is refused."""

    def __init__(self, shard: Any, fn: Callable[[Any], Any], name: str | None = None) -> None:
        self.shard, self.fn = shard, fn
        self.name = name or f"{shard.name} | map {code_digest(fn)[:16]}"

    def reset(self, state: dict | None = None) -> None:
        self.shard.reset(state)

    def next(self) -> Any:
        return self.fn(self.shard.next())

    def get_state(self) -> dict:
        return self.shard.get_state()

    def close(self) -> None:
        close_of(self.shard)

    def __copy__(self) -> "MappedShard":
        """A reader's own copy: of the shard under it too (each reader reads its own)."""
        return MappedShard(copy.copy(self.shard), self.fn, self.name)


def _refilled(record: Any, before: Any, held: Any) -> str | None:
    """Where ``record`` holds the very object the record ``before`` it held, changed since
    (``held``: a copy of ``before`` as it was read): ``""`` when it is that object itself, else
    the key or index of the array; ``None`` when nowhere (a constant shared is not changed)."""
    if record is before and type(record) in _MUTABLE:
        return None if _same(record, held) else ""
    if type(record) is dict and type(before) is dict:
        for key, value in record.items():
            if type(value) is np.ndarray and value is before.get(key) and not _same(value,
                                                                                   held[key]):
                return f"[{key!r}]"
    elif type(record) is tuple and type(before) is tuple:
        for i, (value, was) in enumerate(zip(record, before)):
            if type(value) is np.ndarray and value is was and not _same(value, held[i]):
                return f"[{i}]"
    return None


_MUTABLE = (dict, list, np.ndarray)


def _held(record: Any) -> Any:
    """A copy of what ``record`` holds now: its own arrays and containers, one level down."""
    if type(record) is dict:
        return {k: v.copy() if type(v) is np.ndarray else v for k, v in record.items()}
    if type(record) in (tuple, list):
        return [v.copy() if type(v) is np.ndarray else v for v in record]
    return record.copy() if type(record) is np.ndarray else None


def _same(value: Any, held: Any) -> bool:
    if type(value) is np.ndarray:
        return type(held) is np.ndarray and np.array_equal(value, held)
    if type(value) is dict:
        return type(held) is dict and value.keys() == held.keys() and all(
            _same(v, held[k]) for k, v in value.items())
    if type(value) is list:
        return type(held) is list and len(value) == len(held) and all(
            _same(v, w) for v, w in zip(value, held))
    try:
        return value is held or bool(value == held)
    except Exception:  # (a comparison that does not give one bool: not the same, then)
        return False
