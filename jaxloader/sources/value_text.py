"""A value's text as every process writes it (``value_text``), for ``code_digest``: ``repr``
without memory addresses (an object whose ``repr`` has one by its attributes), and every set
whose order is its run's (strings, paths, objects hashed by their address: Python's hash key or
an address differs each run) written sorted, at any depth of a tuple, list, dict, dataclass or
named tuple. A state saved under the same function then restores in a new process.

Example:
    >>> value_text({"b", "a"}) == value_text({"a", "b"})
    True
"""

from __future__ import annotations

import collections
import collections.abc
import contextvars
import dataclasses
import datetime
import decimal
import enum
import fractions
import hashlib
import itertools
import os
import re
import types
import uuid
from typing import Any

import numpy as np


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_PLACE = re.compile(r" at (?:/|[A-Za-z]:\\)[^\s'\"<>]*:\d+")  # (' at /path/file.py:12')


def value_text(value: Any, whole: bool = False, depth: int = 0, tail: bool = False) -> str:
    """``repr(value)`` as every process writes it (its first 200 characters; ``whole``: all
    of it, an array by its bytes): without memory addresses, and where the repr had one
    (``object``'s own) with the object's attributes instead (``__dict__`` and ``__slots__``, two
    levels down); a set of strings in sorted order. ``tail``: where the text is longer than
    200 characters, a digest of what the value holds past them (``tail_digest``: a list of
    files that grew at its end; versions until 2026-11-30's thirty-fifth session left it
    out: ``abilities.OLDER_DIGESTS``)."""
    if whole and isinstance(value, np.ndarray) and not value.dtype.hasobject:
        data = hashlib.blake2b(np.ascontiguousarray(value).tobytes(), digest_size=16)
        return f"array({value.dtype}, {value.shape}, {data.hexdigest()})"
    if isinstance(value, (set, frozenset)) and _hash_ordered(value, len(value) < 2):
        text = _sorted_set(value)  # (a set of one Enum member: repr's text, as before)
        return text if whole else _cut(text, tail and len(text) > 200, value)
    text = written(value, None if whole else 201 if tail else 200)
    text = text if whole else _cut(text, tail and len(text) > 200, value)
    if _ADDRESS.search(text) is None:
        return _PLACE.sub("", text) if PLACES_LEFT_OUT.get() else text
    if depth < 2:
        attributes = attributes_of(value)
        if attributes:
            said = repr([(k, value_text(v, whole, depth + 1, tail))
                         for k, v in sorted(attributes.items())])
            text += said if whole else said[:400]  # (each attribute's tail in it)
    text = _ADDRESS.sub("", text)
    return _PLACE.sub("", text) if PLACES_LEFT_OUT.get() else text


def _cut(text: str, long: bool, value: Any) -> str:
    """``text``'s first 200 characters, and where it is ``long``, ``tail_digest(value)``."""
    return f"{text[:200]}...{tail_digest(value)}" if long else text[:200]


_TAIL_ITEMS = 100_000  # items a tail digest walks in Python at most (then containers' lengths)


def tail_digest(value: Any) -> str:
    """A digest of what ``value`` holds, the same in every process: containers (lists, tuples,
    dicts and other mappings, deques, sets in sorted order, dataclasses, named tuples,
    namespaces) item by item; strings, numbers, paths and times by their ``repr``; pandas
    objects by their labels and values (hashed by pandas); a NumPy array by its dtype, shape
    and (up to 4,096 spaced) values; another object by its type and length alone (its
    ``repr`` may hold a set in the run's order, its attributes a time or a logger's table of
    every logger). Past ``_TAIL_ITEMS`` items walked, containers by their length."""
    walk = _Tail()
    walk.add(value, 0)
    return walk.digest.hexdigest()


_BY_TEXT = (os.PathLike, datetime.date, datetime.time, datetime.timedelta, decimal.Decimal,
            fractions.Fraction, uuid.UUID, enum.Enum, range, slice, np.dtype)


class _Tail:
    def __init__(self) -> None:
        self.digest = hashlib.blake2b(digest_size=8)
        self.left = _TAIL_ITEMS
        self.path: set[int] = set()

    def add(self, value: Any, depth: int) -> None:
        kind, update = type(value), self.digest.update
        if kind in ATOMIC or isinstance(value, (np.generic, *_BY_TEXT)):
            update(_ADDRESS.sub("", repr(value)).encode(errors="surrogatepass"))
            return
        if kind.__module__.split(".")[0] == "pandas" and hasattr(value, "shape"):
            update(_pandas_text(value))  # (its values and labels: not a repr's display)
            return
        if isinstance(value, np.ndarray) and value.ndim == 0 and depth < _DEPTH and (
                id(value) not in self.path):  # (np.save of a dict: its item)
            self.path.add(id(value))
            self.add(value.item(), depth + 1)
            self.path.discard(id(value))
            return
        if isinstance(value, np.ndarray) and not value.dtype.hasobject:
            from jaxloader.base.columns import spaced_values

            update(f"{value.dtype}{value.shape}".encode())
            update(np.ascontiguousarray(spaced_values(value, 4096)).tobytes())
            return
        if isinstance(value, (set, frozenset)):  # (each item's own digest, sorted; past the
            items = sorted(tail_digest(v) for v in value) if len(value) <= self.left else []
            self.left -= len(value)  # budget its length: a part would be the run's order's)
            update(f"{kind.__name__}{len(value)}{items}".encode())
            return
        items, opening, closing = _shape(value)
        if items is None:  # (other mappings, deques, an object array; an object's attributes)
            items, opening, closing = _other_items(value)
        if items is None or depth >= _DEPTH or id(value) in self.path or self.left <= 0:
            update(f"<{kind.__qualname__}{_length(value)}>".encode())  # (another object:
            return  # its type; its repr may hold a set in the run's order, its attributes a
            # time, a logger's table of every logger: another digest in each process)
        if kind in (list, tuple, dict) and all(type(v) in ATOMIC for v in _shape(value)[0]):
            update(repr(value).encode(errors="surrogatepass"))  # (at C speed)
            self.left -= len(value)
            return
        self.path.add(id(value))
        update(opening.encode())
        for item in items:
            if self.left <= 0:  # (the rest by the container's length)
                update(f"...{_length(value)}".encode())
                break
            self.left -= 1
            self.add(item, depth + 1)
            update(b",")
        update(closing.encode())
        self.path.discard(id(value))


def _other_items(value: Any) -> tuple[Any, str, str]:
    """What ``tail_digest`` walks of a value ``written`` does not: a mapping's keys and values
    in turn (an ``OrderedDict``, a ``Counter``), a sequence's items (a ``deque``, an object
    array); ``(None, "", "")`` for others."""
    name = type(value).__qualname__
    if isinstance(value, collections.abc.Mapping):
        return itertools.chain.from_iterable(value.items()), f"{name}{{", "}"
    if isinstance(value, collections.deque) or isinstance(value, np.ndarray) and value.ndim:
        return iter(value.tolist() if isinstance(value, np.ndarray) else value), f"{name}[", "]"
    return None, "", ""  # (a 0-d array met again: one that holds itself)


def _length(value: Any) -> str:
    try:
        return str(len(value))
    except Exception:  # noqa: BLE001 - none, or one that raises (a 0-d array)
        return ""


_PANDAS_ROWS = 100_000  # rows of a pandas object hashed at most, spaced (as an array's values)


def _pandas_text(value: Any) -> bytes:
    """A pandas object's shape, labels and values as bytes (its rows hashed by pandas: the
    same in every process), or its shape where they cannot be hashed."""
    try:
        import pandas as pd

        step = max(1, len(value) // _PANDAS_ROWS)  # (a table of millions: rows spaced)
        rows = pd.util.hash_pandas_object(value.iloc[::step], index=True).to_numpy()
        names = repr([list(getattr(value, "columns", [getattr(value, "name", None)])),
                      getattr(value.index, "names", None)])
        return f"{value.shape}{names}".encode() + rows.tobytes()
    except Exception:  # noqa: BLE001 - a frame of lists, objects pandas cannot hash
        return repr(value.shape).encode()


def _sorted_set(value: Any) -> str:
    """A set whose order is the run's hash order, written sorted (each item as ``written``)."""
    return f"{type(value).__name__}({sorted(_ADDRESS.sub('', written(v)) for v in value)!r})"


def written(value: Any, limit: int | None = None) -> str:
    """``repr(value)`` (at least its first ``limit`` characters where it is longer; ``None``:
    all of it), where every set of two or more strings in a tuple, list, dict (a
    ``defaultdict`` too), dataclass, named tuple or ``SimpleNamespace``, at any depth, is
    written sorted: ``repr`` wrote it in the order of this run's
    hash key, so a state saved under a ``partial(fn, stop={"a", "b"})`` was refused in every
    new process. Without such a set the text is ``repr``'s (what older versions digested)."""
    try:
        return _Written(limit).text(value, 0)[0]
    except Exception:  # noqa: BLE001 - a repr that raises: the type says what it can
        return f"<{type(value).__qualname__}>"


_DEPTH = 16  # containers written item by item, at most this deep
ATOMIC = (str, int, float, bool, bytes, type(None))  # (a container of these: repr's own)


class _Written:
    """``written``'s writer: a container's items in turn, each as ``repr`` writes it, until the
    text holds ``limit`` characters (a 200,000-word vocabulary is not walked for 200)."""

    def __init__(self, limit: int | None) -> None:
        self.left = limit
        self.path: set[int] = set()  # (containers being written: a cycle is written as repr)

    def text(self, value: Any, depth: int) -> tuple[str, bool]:
        """``value``'s text and whether it is whole (not cut at the limit)."""
        kind = type(value)
        if isinstance(value, (set, frozenset)) and len(value) > 1 and _hash_ordered(value):
            return self._spent(_sorted_set(value))
        items, opening, closing = _shape(value)
        if items is None or depth >= _DEPTH or self.left is None and kind not in _OWN_FORM \
                and all(type(v) in ATOMIC for v in _shape(value)[0]):  # (whole: repr's, fast)
            return self._spent(repr(value))
        if id(value) in self.path:
            return self._spent(_CYCLE.get(kind, "..."))
        self.path.add(id(value))
        out = [opening]
        names = _field_names(value) if opening.endswith("(") and kind is not tuple and \
            kind not in _OWN_FORM else None
        try:
            for i, item in enumerate(items):  # (lazily: the first 200 characters' worth)
                if i:
                    out.append(": " if issubclass(kind, dict) and i % 2 else ", ")
                if names is not None:
                    out.append(f"{names[i]}=")
                written, whole = self.text(item, depth + 1)
                out.append(written)
                if not whole:
                    return "".join(out), False
        finally:
            self.path.discard(id(value))
        if kind is tuple and len(value) == 1:
            out.append(",")
        out.append(closing)
        return "".join(out), True

    def _spent(self, text: str) -> tuple[str, bool]:
        if self.left is None:
            return text, True
        self.left -= len(text)
        return text, self.left > 0


_CYCLE: dict[type, str] = {list: "[...]", dict: "{...}", tuple: "(...)"}


def _shape(value: Any) -> tuple[Any, str, str]:
    """The items ``written`` writes one by one (an iterator: a dict's keys and values in turn,
    a dataclass's or named tuple's fields) and what opens and closes them; ``(None, "", "")``
    for other values."""
    kind = type(value)
    if kind is list or kind is tuple or kind is dict:
        return _items(value), *_BRACKETS[kind]
    if kind is collections.defaultdict:
        return _items(value), f"defaultdict({value.default_factory!r}, {{", "})"
    if kind is types.SimpleNamespace:
        return iter(vars(value).values()), "namespace(", ")"
    if kind in (set, frozenset) and len(value) == 1:  # (a set of one set of strings)
        return iter(value), "{" if kind is set else "frozenset({", "}" if kind is set else "})"
    if isinstance(value, tuple) and getattr(kind.__repr__, "__code__", None) is _NAMED_REPR:
        return iter(value), f"{kind.__name__}(", ")"
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and \
            _generated_repr(kind):
        return (getattr(value, n) for n in _field_names(value)), f"{kind.__qualname__}(", ")"
    if CONTAINERS_WRITTEN.get():  # (Python 3.12's repr of each, under every Python)
        if kind is collections.OrderedDict:
            return _items(value), "OrderedDict({", "})"
        if kind is collections.deque:
            return iter(value), "deque([", "])" if value.maxlen is None else \
                f"], maxlen={value.maxlen})"
        if kind is collections.ChainMap:
            return iter(value.maps), "ChainMap(", ")"
        if kind is types.MappingProxyType:
            return iter([dict(value)]), "mappingproxy(", ")"
        if kind is np.ndarray and value.dtype.hasobject:
            return iter([value.tolist()]), "array(", f", dtype=object, shape={value.shape})"
    return None, "", ""


_BRACKETS: dict[type, tuple[str, str]] = {list: ("[", "]"), tuple: ("(", ")"), dict: ("{", "}")}
_OWN_FORM = (collections.OrderedDict, collections.deque, collections.ChainMap,
             types.MappingProxyType, np.ndarray)  # (``CONTAINERS_WRITTEN``: not as repr)


def _items(value: Any) -> Any:
    """A list's, a tuple's or a set's items, a dict's keys and values in turn (an iterator)."""
    return itertools.chain.from_iterable(value.items()) if isinstance(value, dict) else \
        iter(value)


def _field_names(value: Any) -> list[str]:
    if isinstance(value, types.SimpleNamespace):
        return list(vars(value))
    if isinstance(value, tuple):
        return list(type(value)._fields)  # type: ignore[attr-defined]
    return [f.name for f in dataclasses.fields(value) if f.repr]


_NAMED_REPR = getattr(collections.namedtuple("_Named", "a").__repr__, "__code__", None)


def _generated_repr(kind: type) -> bool:
    """Whether ``kind`` is a dataclass whose ``__repr__`` is the generated one (``written``
    writes that form only; one of the class's own is left to itself)."""
    wrapped = getattr(kind.__repr__, "__wrapped__", None)  # (reprlib.recursive_repr's)
    return getattr(wrapped, "__qualname__", "").endswith("__create_fn__.<locals>.__repr__")


def attributes_of(value: Any, plain: bool = False) -> dict[str, Any]:
    """``value``'s own attributes: its ``__dict__`` and its classes' ``__slots__``; what cannot
    be read left out (a config object's ``__getattr__`` that raised ``KeyError`` for
    ``__dict__`` failed the loader as it was made). ``plain``: read as ``object`` reads them,
    no ``__getattr__`` of the user's run for what is not set (digests read them as they did)."""
    read = (lambda name: object.__getattribute__(value, name)) if plain else (
        lambda name: getattr(value, name))
    try:
        own = read("__dict__") if plain else getattr(value, "__dict__", None)
        found = dict(own or {})
    except Exception:  # noqa: BLE001 - (the user's __getattr__; none: slots alone)
        found = {}
    for cls in type(value).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if isinstance(slot, str) and slot not in ("__dict__", "__weakref__"):
                try:
                    found[slot] = read(slot)
                except Exception:  # noqa: BLE001 - (not set: AttributeError)
                    pass
    return found


def _hash_ordered(value: Any, text_only: bool = False) -> bool:
    """Whether a set's order depends on the process, not on its values alone: strings and
    bytes are hashed with a random key each run, and so are what hash them (an ``Enum``
    member by its name, a hashable dataclass by its fields, a tuple by its items, a path, a
    compiled pattern, a date), and an object hashed by its address; only numbers (and
    ``None``) hash the same in every process. ``text_only``: strings and bytes and tuples of
    them only (what older versions sorted)."""
    return any(_random_hash(v, text_only) for v in value)


_FIXED_HASH = (int, float, complex, type(None), decimal.Decimal, fractions.Fraction,
               np.number, np.bool_)  # (hashed by their value: a set of them keeps its order)


def _random_hash(v: Any, text_only: bool) -> bool:
    if isinstance(v, (str, bytes)):
        return True
    if isinstance(v, (tuple, frozenset)):
        return _hash_ordered(v, text_only)
    if text_only:
        return False
    if isinstance(v, enum.Enum):
        return type(v).__hash__ is enum.Enum.__hash__
    params = getattr(type(v), "__dataclass_params__", None)  # (a generated __hash__:)
    if params is not None and (params.unsafe_hash or params.eq and params.frozen):
        return _hash_ordered([getattr(v, f.name) for f in dataclasses.fields(v)
                              if (f.compare if f.hash is None else f.hash)])
    return not isinstance(v, _FIXED_HASH) and not SETS_AS_BEFORE.get()


# set by code_digest(sets_as_before=True): sets of other values than strings, Enum members and
# dataclasses written in their run's order, as versions until 2026-11-30's 34th session did (a
# set of UUIDs or timedeltas has the same order in every process: such states restore)
SETS_AS_BEFORE: contextvars.ContextVar[bool] = contextvars.ContextVar("sets", default=False)

# set by code_digest at this version's digest level: a place in code (" at /path/file.py:12",
# which jax.jit's object holds of its function) left out, as an address is: another with each
# kernel, each copy of the code, each line added above (versions until 2026-12-02's 45th
# session kept it)
PLACES_LEFT_OUT: contextvars.ContextVar[bool] = contextvars.ContextVar("places", default=False)

# set by code_digest at this version's digest level: an OrderedDict, a deque, a ChainMap, a
# mappingproxy and an object array written item by item in one form (their sets sorted), where
# versions until 2026-12-03 took their repr (an OrderedDict's changed in Python 3.12, and a set
# in one was in the run's order): what every older level writes
CONTAINERS_WRITTEN: contextvars.ContextVar[bool] = contextvars.ContextVar("written",
                                                                         default=False)
