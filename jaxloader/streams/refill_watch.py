"""``RefillWatch``: a shard whose first records are watched for a buffer filled again.

A generator that fills one array and yields it again (or yields a new view of it, or the same
dict) changes the records read before it, which wait in a batch or a shuffle window: each of
them then holds the last values, without a word. A reader opens each shard through a watch:
just before the shard is asked for a record, a sample of each array the record before holds
is taken (what it holds now, after any transform of it), and each number or string it holds
noted (a dict yielded again with new numbers holds other objects); just after, it is
compared. Only the shard's code ran in between, so a change is a buffer refilled, never a
constant shared by every record nor a ``Map`` that copies. The first ``CHECKED`` records of
each shard opened are watched (a buffer refilled is refilled from the first: the second record
shows it; each watched record costs some microseconds, and each shard is opened again at every
restore); then the watch steps aside (the shard's own ``next`` is called, at no cost).
A file's shard, whose records are parsed anew, is not watched.

Example:
    >>> import warnings
    >>> from jaxloader.streams.iterable_shards import IterableShard
    >>> def refilling():
    ...     buffer = np.zeros(2)
    ...     for i in range(3):
    ...         buffer[:] = i
    ...         yield {"x": buffer}
    >>> shard = IterableShard(refilling, name="sim"); shard.reset(None)
    >>> watch = RefillWatch(shard)
    >>> with warnings.catch_warnings(record=True) as said:
    ...     warnings.simplefilter("always")
    ...     records = [watch.next() for _ in range(3)]
    >>> str(said[0].message)[:81]
    "stream shard sim: a record's leaf ['x'] changed as the shard made the next record"
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from jaxloader.base.abilities import close_of
from jaxloader.base.columns import spaced_values
from jaxloader.base.errors import JaxloaderWarning, user_stacklevel
from jaxloader.streams.huggingface import HuggingFaceShard
from jaxloader.streams.shards import FileShard

CHECKED = 2  # records watched after each shard is opened (a buffer is refilled from the first)
_LEAVES = 32  # arrays of a record sampled, at most
_SAMPLE = 1024  # elements of an array compared, at most (spread over it)


def watched(shard: Any) -> Any:
    """``shard`` through a ``RefillWatch`` where its records come from code that may refill a
    buffer (a generator, a map, a shard of the user's); a file's or a Hugging Face dataset's
    shard, whose records are parsed anew each time, as it is."""
    return shard if isinstance(shard, (FileShard, HuggingFaceShard)) else RefillWatch(shard)


REFILL_SAID: set[str] = set()  # shards' code (make in make[3]) warned of, in this process

class RefillWatch:
    """``shard`` (any ``Shard``), whose ``next()`` warns once where the record before changed
    while the shard made the next one; the rest of the shard protocol is the shard's."""

    def __init__(self, shard: Any) -> None:
        self._shard, self.name = shard, shard.name
        self._left = CHECKED
        self._last: Any = None  # the record read before, while it is watched

    def reset(self, state: dict | None = None) -> None:
        self._shard.reset(state)
        self.__dict__.pop("next", None)  # (watched again from here)
        self._left, self._last = CHECKED, None

    def get_state(self) -> dict:
        return self._shard.get_state()

    def close(self) -> None:
        close_of(self._shard)

    def next(self) -> Any:
        last, shard = self._last, self._shard
        before = None if last is None else samples(last)
        record = shard.next()
        self._left -= 1
        where = None if before is None else changed(before, last)
        if where is not None and self.name.partition("[")[0] not in REFILL_SAID:  # (once a
            REFILL_SAID.add(self.name.partition("[")[0])  # shards' code: not each of 1,000)
            warnings.warn(
                f"stream shard {self.name}: a record's leaf {where} changed as the shard made "
                f"the next record (the shard now at {_state(shard)}): the shard's code fills one "
                "buffer (or one dict) again and yields it again, so the records already read "
                "(waiting in a batch or a shuffle window) each hold its last values; yield new "
                "arrays in a new dict for each record (a copy: buf.copy()) (said once in this "
                "process for the shards of this code: its other shards may do the same)",
                JaxloaderWarning, stacklevel=user_stacklevel())
        if where is not None or self._left <= 0:
            self.next = shard.next  # type: ignore[method-assign]  # (watched enough)
            self._last = None
        else:
            self._last = record
        return record


_SCALARS = (int, float, complex, str, bytes, np.generic)


def samples(record: Any) -> list[tuple[str, Any, Any]]:
    """``(path, array, sample of its bytes)`` for the numeric arrays ``record`` holds (up to
    ``_LEAVES``), then ``(path, value, None)`` for its numbers and strings, compared as objects
    (the same dict given new values holds new ones), and ``(path, list, its length and items
    at spaced places)`` for a list of them (token ids: one leaf), up to ``_LEAVES`` of those:
    a record of many numbers still has its arrays sampled."""
    arrays: list[tuple[str, Any, Any]] = []
    scalars: list[tuple[str, Any, Any]] = []
    _walk(record, "", arrays, scalars, 0)
    return arrays + scalars


def _walk(value: Any, path: str, arrays: list, scalars: list, depth: int) -> None:
    if depth > 4 or (len(arrays) >= _LEAVES and len(scalars) >= _LEAVES):
        return
    if isinstance(value, np.ndarray):  # (a memmap's too)
        if len(arrays) < _LEAVES and not value.dtype.hasobject and value.size:
            arrays.append((path, value, _sample(value)))
    elif isinstance(value, _SCALARS):
        if len(scalars) < _LEAVES:
            scalars.append((path, value, None))
    elif isinstance(value, dict):
        for key, item in value.items():
            _walk(item, f"{path}[{key!r}]", arrays, scalars, depth + 1)
    elif type(value) in (list, tuple):
        if value and all(isinstance(item, _SCALARS) for item in _spaced(value)):
            if len(scalars) < _LEAVES:  # (a list of numbers refilled in place: its items)
                scalars.append((path, value, _sample(value)))
            return
        for i, item in enumerate(value[:_LEAVES]):
            _walk(item, f"{path}[{i}]", arrays, scalars, depth + 1)


def _spaced(items: list | tuple) -> list | tuple:
    """A list's items at up to ``_SAMPLE`` spaced places (a left-padded one's too)."""
    return items[::max(1, len(items) // _SAMPLE)]


def _sample(value: Any) -> Any:
    """An array's bytes at spaced places, or a list's length and items at spaced places."""
    if isinstance(value, np.ndarray):
        return spaced_values(value, _SAMPLE).tobytes()
    return len(value), tuple(_spaced(value))


def changed(taken: list[tuple[str, Any, Any]], record: Any) -> str | None:
    """Where ``record`` (walked again: a dict or list yielded again may hold other arrays
    now) no longer holds what ``taken`` (``samples``) saw."""
    now = samples(record)
    for (path, array, sample), (path_now, array_now, _) in zip(taken, now):
        if path_now != path or array_now is not array or (
                sample is not None and _sample(array) != sample):
            return path or "(the record itself)"
    if len(now) != len(taken):
        return (now[len(taken)][0] if len(now) > len(taken)
                else taken[len(now)][0]) or "(the record itself)"
    return None


def _state(shard: Any) -> str:
    try:
        return repr(shard.get_state())
    except Exception:  # noqa: BLE001 - a name for a message only
        return "(its place unknown)"
