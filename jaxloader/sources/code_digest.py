"""``code_digest``: what a function computes, as far as its code says, the same in every process.

A ``MapSource``'s fingerprint and a ``Stream.map``'s shard names carry it, so that a state saved
under another function is refused; a ``FilteredSource``'s kept indices carry its ``deep`` form,
so that a file kept by another predicate is found again (``kept_arrays``). What a ``repr``
shows differently in each process is left out (a memory address, ``<Scale object at 0x7f...>``,
where an object's attributes are its own; the order of a set of strings, paths, patterns or
any but numbers, at any depth of a tuple, list, dict or dataclass, which Python hashes with a
random key or an address each run), so a state saved under the same function restores in a
new process; a list or dict built from such a set keeps that run's order (build it sorted).
What code reads without naming it (a file, a database) is not seen.

Example:
    >>> code_digest(lambda r: r * 2) == code_digest(lambda r: r * 3)
    False
"""

from __future__ import annotations

import collections
import dataclasses
import decimal
import dis
import enum
import fractions
import functools
import hashlib
import itertools
import inspect
import os
import re
import site
import sysconfig
import types
from typing import Any

import numpy as np


def code_digest(fn: Any, deep: bool = False, bound: bool = False, defaults: bool = True) -> str:
    """A digest of ``fn``: its name, source text (where Python has it: a script's or a notebook's),
    the names and constants its code uses (nested functions' too: two lambdas on one line), its
    closure's values and default arguments' (``lambda r, m=m: ...``; a ``functools.partial``: its
    function and arguments); for another callable, its type and ``repr`` too. Not its bytecode,
    which differs between Python versions.

    ``deep``: also the values of the globals its code names, the functions and values of the
    user's own modules (not installed ones) it names, and a bound method's object, each whole
    (an array by its bytes, not its ``repr``'s first characters): what a predicate reads beyond
    its closure, for a file kept from it. Not for states: a global object whose ``repr``
    changes from run to run would refuse a resume.

    ``bound``: also a bound method's object (its ``repr``, or its attributes where that has an
    address): a Grain transform's parameters, which its ``map`` method reads.

    ``defaults=False``: not default arguments, as versions until 2026-11-30 digested (what a
    state saved then holds: ``base.abilities.OLDER``).
    """
    return _Digests(deep, bound, defaults).of(fn, frozenset())


class _Digests:
    """The digests of one ``code_digest`` call, each function's once (a helper called from
    many places, a function that calls itself)."""

    def __init__(self, deep: bool, bound: bool = False, defaults: bool = True) -> None:
        self.deep, self.bound, self.defaults = deep, bound, defaults
        self.done: dict[int, str] = {}

    def of(self, fn: Any, within: frozenset) -> str:
        if id(fn) in self.done:
            return self.done[id(fn)]
        within = within | {id(fn)}
        digest = hashlib.blake2b(digest_size=16)
        if isinstance(fn, functools.partial):
            digest.update(b"partial:" + self.of(fn.func, within).encode())
            digest.update(_value_text((fn.args, sorted(fn.keywords.items())), self.deep)
                          .encode())
            self.done[id(fn)] = found = digest.hexdigest()
            return found
        code = getattr(fn, "__code__", None)
        if code is None:
            call = getattr(type(fn), "__call__", None)
            digest.update(f"{type(fn).__qualname__}:{_value_text(fn)}".encode())
            code = getattr(call, "__code__", None)
        else:
            digest.update(getattr(fn, "__qualname__", "").encode())
        try:
            digest.update(inspect.getsource(fn if code is getattr(fn, "__code__", None)
                                            else type(fn)).encode())
        except (OSError, TypeError):
            pass  # (no source: built by exec, or the interpreter's prompt)
        if code is not None:
            _update_code(digest, code)
        closure = [cell.cell_contents for cell in getattr(fn, "__closure__", None) or ()
                   if filled(cell)]
        for value in closure + (_defaults(fn) if self.defaults else []):
            if id(value) not in within:
                digest.update(self._value(value, within).encode())
        owner = getattr(fn, "__self__", None)
        if self.deep:
            for value in [owner, *_globals_named(fn, code, closure)]:
                if id(value) not in within and not isinstance(value, types.ModuleType):
                    digest.update(self._value(value, within).encode())
        elif self.bound and owner is not None and id(owner) not in within and not isinstance(
                owner, types.ModuleType):
            digest.update(self._value(owner, within).encode())
        self.done[id(fn)] = found = digest.hexdigest()
        return found

    def _value(self, value: Any, within: frozenset) -> str:
        if not callable(value):
            return _value_text(value, self.deep)
        if self.deep and inspect.isfunction(value) and not _users(
                inspect.getmodule(value)):  # (an installed library's: by its name)
            return f"{value.__module__}.{value.__qualname__}"
        return self.of(value, within)


def _defaults(fn: Any) -> list:
    """``fn``'s default arguments (a callable object's ``__call__``'s), keyword-only ones with
    their names: a value bound as one (``lambda r, m=m: ...``) is in no source text."""
    held = fn if hasattr(fn, "__defaults__") else getattr(type(fn), "__call__", None)
    keywords = sorted((getattr(held, "__kwdefaults__", None) or {}).items())
    return [*(getattr(held, "__defaults__", None) or ()), *(v for pair in keywords for v in pair)]


def filled(cell: Any) -> bool:
    """Whether a closure cell holds a value (an empty one raises when read)."""
    try:
        cell.cell_contents
    except ValueError:  # (an empty cell)
        return False
    return True


def _globals_named(fn: Any, code: Any, closure: list) -> list:
    """The values of the globals ``code`` names (nested code's too), and what it names through
    a user's module (not an installed one), a global or in the ``closure``."""
    space = getattr(fn, "__globals__", None) or getattr(
        getattr(type(fn), "__call__", None), "__globals__", None) or {}
    named: set[str] = set()
    attributes: set[str] = set()
    if code is not None:
        _names(code, named, attributes)
    found = [space[name] for name in sorted(named) if name in space]
    for module in [v for v in found + closure if isinstance(v, types.ModuleType) and _users(v)]:
        found += [getattr(module, name) for name in sorted(attributes)
                  if hasattr(module, name) and not isinstance(getattr(module, name),
                                                              types.ModuleType)]
    return found


def _names(code: Any, named: set[str], attributes: set[str]) -> None:
    """The global names ``code`` loads (not an attribute that has a global's name), and the
    attribute names it loads (``module.function``), nested code's too."""
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            named.add(instruction.argval)
        elif instruction.opname in ("LOAD_ATTR", "LOAD_METHOD"):
            attributes.add(instruction.argval)
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            _names(const, named, attributes)


def _installed() -> tuple[str, ...]:
    paths = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib",
                                                     "platlib")}
    paths |= set(getattr(site, "getsitepackages", list)())
    paths.add(getattr(site, "getusersitepackages", str)())
    return tuple(os.path.abspath(p) for p in paths if p)


_INSTALLED = _installed()


def _users(module: Any) -> bool:
    """Whether ``module`` is the user's own code: a file not under Python's library or a
    site-packages or dist-packages folder, or a notebook's ``__main__`` (no file), or code
    whose module is not known (built by ``exec``)."""
    if module is None:
        return True
    path = getattr(module, "__file__", None)
    if not isinstance(path, str):
        return getattr(module, "__name__", None) == "__main__"
    path = os.path.abspath(path)
    parts = path.split(os.sep)
    return not path.startswith(_INSTALLED) and "site-packages" not in parts and (
        "dist-packages" not in parts)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _value_text(value: Any, whole: bool = False, depth: int = 0) -> str:
    """``repr(value)`` as every process writes it (its first 200 characters; ``whole``: all
    of it, an array by its bytes): without memory addresses, and where the repr had one
    (``object``'s own) with the object's attributes instead (``__dict__`` and ``__slots__``, two
    levels down); a set of strings in sorted order."""
    if whole and isinstance(value, np.ndarray) and not value.dtype.hasobject:
        data = hashlib.blake2b(np.ascontiguousarray(value).tobytes(), digest_size=16)
        return f"array({value.dtype}, {value.shape}, {data.hexdigest()})"
    if isinstance(value, (set, frozenset)) and _hash_ordered(value, len(value) < 2):
        text = _sorted_set(value)  # (a set of one Enum member: repr's text, as before)
        return text if whole else text[:200]
    text = _repr(value, None if whole else 200)
    text = text if whole else text[:200]
    if _ADDRESS.search(text) is None:
        return text
    if depth < 2:
        attributes = attributes_of(value)
        if attributes:
            said = repr([(k, _value_text(v, whole, depth + 1))
                         for k, v in sorted(attributes.items())])
            text += said if whole else said[:400]
    return _ADDRESS.sub("", text)


def _sorted_set(value: Any) -> str:
    """A set whose order is the run's hash order, written sorted (each item as ``_repr``)."""
    return f"{type(value).__name__}({sorted(_ADDRESS.sub('', _repr(v)) for v in value)!r})"


def _repr(value: Any, limit: int | None = None) -> str:
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
    """``_repr``'s writer: a container's items in turn, each as ``repr`` writes it, until the
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
        if items is None or depth >= _DEPTH or self.left is None and all(
                type(v) in ATOMIC for v in _shape(value)[0]):  # (whole: repr's, at C speed)
            return self._spent(repr(value))
        if id(value) in self.path:
            return self._spent(_CYCLE.get(kind, "..."))
        self.path.add(id(value))
        out = [opening]
        names = _field_names(value) if opening.endswith("(") and kind is not tuple else None
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
    """The items ``_repr`` writes one by one (an iterator: a dict's keys and values in turn,
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
    return None, "", ""


_BRACKETS: dict[type, tuple[str, str]] = {list: ("[", "]"), tuple: ("(", ")"), dict: ("{", "}")}


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
    """Whether ``kind`` is a dataclass whose ``__repr__`` is the generated one (``_repr``
    writes that form only; one of the class's own is left to itself)."""
    wrapped = getattr(kind.__repr__, "__wrapped__", None)  # (reprlib.recursive_repr's)
    return getattr(wrapped, "__qualname__", "").endswith("__create_fn__.<locals>.__repr__")


def attributes_of(value: Any) -> dict[str, Any]:
    """``value``'s own attributes: its ``__dict__`` and its classes' ``__slots__``."""
    found = dict(getattr(value, "__dict__", None) or {})
    for cls in type(value).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if isinstance(slot, str) and slot not in ("__dict__", "__weakref__") and hasattr(
                    value, slot):
                found[slot] = getattr(value, slot)
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
    return not isinstance(v, _FIXED_HASH)


def _update_code(digest: Any, code: Any) -> None:
    digest.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            _update_code(digest, const)
        else:
            digest.update((_value_text(const) if isinstance(const, frozenset)
                           else _repr(const)).encode())
