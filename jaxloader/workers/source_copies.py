"""The source's arrays that the workers read copies of, looked at again as each run begins.

The payload copies a source's in-memory arrays of 1 MiB or more into shared memory once, as
the pool starts, and pickles smaller ones (``payload``): the workers read those copies. An
array the training process changes in place afterwards (pseudo-labels written over
``labels[:]``, a curriculum's weights) is then read changed with ``num_workers=0`` and as it
was with workers, so the batches depend on the worker count, and ``peek()`` (made in the
training process) differs from the ``next()`` after it, without a word. Each copied array (of
``NOTED_MIN_BYTES`` or more, the first ``MAX_NOTED``) is sampled as it is copied (``SAMPLES``
elements, evenly spaced, its last too), and the samples are compared as each run begins (an
``iter()``) and at a ``peek()``: a change is warned of, once a pool. A change to fewer
elements than the gap between samples may pass unseen. So is an attribute of the user's source
bound anew (``self.labels = new``, a ``set_epoch()``, PyTorch's idioms between epochs), each
compared with what it held as the workers took it (``note_object``).

Example:
    >>> import numpy as np, warnings
    >>> labels = np.zeros(1 << 20, np.int8)
    >>> copies = Copies()
    >>> copies.note(labels)
    >>> copies.changed()
    []
    >>> labels[:] = 7
    >>> copies.changed()
    ['an array of shape (1048576,), int8']
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
import weakref
from typing import Any, ContextManager, Iterator

import numpy as np

from jaxloader.base.errors import JaxloaderWarning, user_stacklevel
from jaxloader.sources.parts import walk

SAMPLES = 4096  # elements looked at in each copied array (a fancy index: microseconds)
NOTED_MIN_BYTES = 1024  # arrays pickled with the payload are noted from this size (labels)
MAX_NOTED = 256  # arrays noted at most (a source of many small arrays: the first ones)


class Copies:
    """The arrays copied for the workers (weakly: one made only to be pickled goes as it
    did), each with its samples as copied."""

    def __init__(self, maker: Any = None) -> None:
        self._held: dict[int, tuple[weakref.ref, np.ndarray, bytes]] = {}
        self._said = False
        self._objects: list[tuple[weakref.ref, dict[str, Any]]] = []
        self.note_object(getattr(maker, "source", None))  # (as the workers are sent it)

    def note_object(self, source: Any) -> None:
        """The attributes of the user's objects in ``source`` (under jaxloader's wrappers:
        through ``source`` and ``sources``) as the workers took them: each compared at
        ``changed()`` with what it holds then (``_kept``). Not those set later, nor those that
        were ``None``: a file handle or a cache opened at the first read is no change of the
        records; nor what jaxloader's own reads here change (``reading``)."""
        for part in itertools.islice(walk(source), 64):  # (a concat's first parts)
            module = type(part).__module__
            if not (module == "jaxloader" or module.startswith("jaxloader.")) and isinstance(
                    getattr(part, "__dict__", None), dict):
                try:
                    self._objects.append((weakref.ref(part), _attributes(part)))
                except TypeError:  # (an object of no weak reference: not looked at)
                    pass

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Around a read jaxloader makes of the source in this process (``peek()``, a state's
        hashes): what the source sets as it reads (a shard cache's index, a memo, a count)
        is taken as it is after, as a worker's copy holds its own; a change made before
        the read is still said."""
        before = [_attributes(ref()) for ref, _ in self._objects]
        try:
            yield
        finally:
            for (ref, then), was in zip(self._objects, before):
                now = getattr(ref(), "__dict__", None)
                for name, value in (now.items() if isinstance(now, dict) else ()):
                    if name in then and name in was and not _same(was[name], value):
                        then[name] = _kept(value)

    def note(self, array: np.ndarray) -> None:
        """``array`` was copied for the workers as it is now (once: pickled again, by value)."""
        if array.size == 0 or array.dtype.hasobject or len(self._held) >= MAX_NOTED or (
                id(array) in self._held and self._held[id(array)][0]() is array):
            return
        where = np.unique(np.linspace(0, array.size - 1, min(SAMPLES, array.size))
                          .astype(np.int64))
        self._held[id(array)] = weakref.ref(array), where, _at(array, where)

    def changed(self) -> list[str]:
        """The arrays alive whose samples differ from their copies', each described."""
        found = ((ref(), where, then) for ref, where, then in self._held.values())
        said = [f"an array of shape {a.shape}, {a.dtype}" for a, where, then in found
                if a is not None and _at(a, where) != then]
        for ref, then in self._objects:
            source = ref()
            now = getattr(source, "__dict__", None)
            if isinstance(now, dict):
                said += [f"its attribute {name!r}, set anew" for name, was in then.items()
                         if was != ("value", None) and (
                             name not in now or not _same(was, now[name]))]
        return said

    def check(self) -> None:
        """Warns, once, where an array the workers read a copy of has changed since."""
        changed = [] if self._said or not (self._held or self._objects) else self.changed()
        if changed:
            self._said = True
            warnings.warn(
                f"the source the workers copied as the loader started (its arrays and "
                f"attributes, or a transform's arrays) changed since ({', '.join(changed[:3])}"
                f"{', ...' if len(changed) > 3 else ''}): the workers read the copy they took, "
                "and num_workers=0 (and peek()) the source as it is now, so the batches "
                "differ by the worker count; make a new loader after changing the source (its "
                "workers copy it anew; load this one's state_dict() into it to keep the "
                "position), or change the records in a Map", JaxloaderWarning,
                stacklevel=user_stacklevel())


def reading(engine: Any) -> ContextManager[None]:
    """``engine``'s ``Copies.reading()`` (a worker pool's, Ray's), else nothing to do."""
    copies = getattr(engine, "copies", None)
    return copies.reading() if copies is not None else contextlib.nullcontext()


def _at(array: np.ndarray, where: np.ndarray) -> bytes:
    """The bytes of ``array``'s elements at flat positions ``where`` (compared as bits: NaN and
    NaT are alike); a contiguous array's by one take (``flat`` costs ~100 us an array)."""
    flat = array.reshape(-1) if array.flags.c_contiguous else array.flat
    return np.asarray(flat[where]).tobytes()


def _attributes(source: Any) -> dict[str, tuple[str, Any]]:
    """``source``'s attributes, each as ``_kept`` holds it (none for an object gone)."""
    attributes = getattr(source, "__dict__", None)
    return {name: _kept(value) for name, value in attributes.items()} if isinstance(
        attributes, dict) else {}


_PLAIN = (int, float, complex, str, bytes, bool, type(None), np.generic)


def _kept(value: Any) -> tuple[str, Any]:
    """What an attribute is compared by, holding nothing it would keep alive: a plain value
    (a number, a str, a tuple of a few) itself; an object of weak references (an array) by
    one; another (a dict, a list) by its ``id`` (one made anew at a freed one's address
    passes unseen)."""
    if isinstance(value, _PLAIN) or type(value) is tuple and len(value) <= 16 and all(
            isinstance(v, _PLAIN) for v in value):
        return "value", value
    try:
        return "ref", weakref.ref(value)
    except TypeError:
        return "id", id(value)


def _same(then: tuple[str, Any], now: Any) -> bool:
    """Whether an attribute holds what it held (``_kept``): the same object, or an equal
    plain value (NaN as NaN: an epoch set to what it was)."""
    how, value = then
    if how == "ref":
        return value() is now
    if how == "id":
        return id(now) == value
    return type(value) is type(now) and (value is now or bool(value == now) or (
        _nan(value) and _nan(now)))


def _nan(value: Any) -> bool:
    try:
        return bool(value != value)
    except (TypeError, ValueError):
        return False
