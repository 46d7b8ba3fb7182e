"""A cheap fingerprint of a source, so that a saved position is not restored into other data.

A step means the same batches only over the same records. The state therefore carries, besides
the source's length, the structure of its first record (leaf paths, dtypes and shapes) and a hash
of a few records at fixed positions (the first, the middle and the last): a few reads, however
large the source. A source may supply its own fingerprint: a ``fingerprint`` attribute (a str,
or a method returning one); a Hugging Face ``datasets.Dataset``'s own is used
(``sources.huggingface``). File sources also name their files' bytes (``source_files``: each
file's size and a hash of its footer or ends, ``jaxloader.base.file_identity``), so that a state
saved over other bytes is refused naming the file that changed.

Example:
    >>> from jaxloader.sources import ArraySource
    >>> fp = source_fingerprint(ArraySource({"x": np.zeros((5, 2), np.float32)}))
    >>> fp["record_spec"], len(fp["record_hash"])
    ("['x']: float32(2,)", 32)
"""

from __future__ import annotations

import dis
import hashlib
import inspect
import os
import re
import sysconfig
import types
from typing import Any, Sequence

import numpy as np

from jaxloader.base import tree as tree_lib
from jaxloader.base.abilities import file_identities_of, fingerprint_of
from jaxloader.sources.parts import walk


def source_fingerprint(source: Any) -> dict[str, str]:
    """``{"source": its own}`` when the source has one, else ``{"record_spec", "record_hash"}``."""
    own = fingerprint_of(source)
    if own is not None:
        return {"source": own}
    n = len(source)
    digest = hashlib.blake2b(digest_size=16)
    spec = ""
    for position in sorted({0, n // 2, n - 1}):
        leaves, treedef = tree_lib.flatten(source[position])
        described = "; ".join(f"{path}: {_describe(leaf)}"
                              for path, leaf in zip(tree_lib.leaf_paths(treedef), leaves))
        spec = spec or described
        digest.update(described.encode())
        for leaf in leaves:
            digest.update(_content(leaf))
    return {"record_spec": spec, "record_hash": digest.hexdigest()}


def _describe(leaf: Any) -> str:
    if isinstance(leaf, (np.ndarray, np.generic)):
        return f"{leaf.dtype}{leaf.shape}"
    return type(leaf).__name__


def _content(leaf: Any) -> bytes:
    if isinstance(leaf, (np.ndarray, np.generic)) and not leaf.dtype.hasobject:
        return np.ascontiguousarray(leaf).tobytes()
    if isinstance(leaf, str):
        return leaf.encode()
    if isinstance(leaf, (bytes, bool, int, float, complex)):
        return leaf if isinstance(leaf, bytes) else repr(leaf).encode()
    return b""  # other objects: their type is in the spec; a repr may hold an address


def combined(kind: str, size: int, sources: Sequence[Any], *own: bytes | str) -> str:
    """The fingerprint of a source made of ``sources`` (their fingerprints, in order) and its
    ``own`` configuration: ``"<kind>:<size>:<digest>"``.

    Example:
        >>> from jaxloader.sources import ArraySource
        >>> combined("twice", 6, [ArraySource({"x": np.zeros(3)})] * 2).startswith("twice:6:")
        True
    """
    digest = hashlib.blake2b(digest_size=16)
    for source in sources:
        digest.update(repr(sorted(source_fingerprint(source).items())).encode())
    for part in own:
        digest.update(part if isinstance(part, bytes) else part.encode())
    return f"{kind}:{size}:{digest.hexdigest()}"


def source_files(source: Any) -> list[tuple[str, list[int]]]:
    """The files ``source`` reads (through the sources it is made of), each with its identity
    as read when its source was made: ``(path, identity)`` in reading order.

    Example:
        >>> from jaxloader.sources import ArraySource
        >>> source_files(ArraySource({"x": np.zeros(3)}))
        []
    """
    found: list[tuple[str, list[int]]] = []
    for each in walk(source):
        found.extend(file_identities_of(each))
    return found


def code_digest(fn: Any, deep: bool = False) -> str:
    """A digest of what ``fn`` computes, as far as its code says: its name, source text (where
    Python has it: a script's or a notebook's), the names and constants its code uses (nested
    functions' too: two lambdas on one line), and its closure's values; for another callable,
    its type and ``repr`` too. Not its bytecode, which differs between Python versions, nor what
    differs from process to process in a ``repr`` (a memory address, ``<Scale object at
    0x7f...>``, where an object's attributes are its own; a set of strings' order): a state
    saved under the same function restores in a new process, one saved under another function
    is refused.

    ``deep``: also the values of the globals its code names, the functions it calls by a global
    name or from a module of the user's (not one installed), and a bound method's object: what
    a predicate reads beyond its closure, for a file kept from it (``kept_arrays``). Not for
    states: a global object whose ``repr`` changes from run to run would refuse a resume.

    Example:
        >>> code_digest(lambda r: r * 2) == code_digest(lambda r: r * 3)
        False
    """
    return _digest(fn, deep, set())


def _digest(fn: Any, deep: bool, within: set) -> str:
    """``code_digest``; ``within``: the ids of the functions being digested around this one
    (a function that calls itself by a global name is digested once)."""
    within = within | {id(fn)}
    digest = hashlib.blake2b(digest_size=16)
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
               if _filled(cell)]
    for value in closure:
        if id(value) not in within:
            digest.update(_value_digest(value, deep, within).encode())
    if deep:
        for value in [getattr(fn, "__self__", None), *_globals_named(fn, code, closure)]:
            if id(value) not in within and not isinstance(value, types.ModuleType):
                digest.update(_value_digest(value, deep, within).encode())
    return digest.hexdigest()


def _value_digest(value: Any, deep: bool, within: set) -> str:
    return _digest(value, deep, within) if callable(value) else _value_text(value)


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # (an empty cell)
        return False
    return True


def _globals_named(fn: Any, code: Any, closure: list) -> list:
    """The values of the globals ``code`` names (nested code's too), and the functions of a
    user's module (not an installed one), a global or in the ``closure``, that it names
    through that module."""
    space = getattr(fn, "__globals__", None) or getattr(
        getattr(type(fn), "__call__", None), "__globals__", None) or {}
    named: set[str] = set()
    attributes: set[str] = set()
    if code is not None:
        _names(code, named, attributes)
    found = [space[name] for name in sorted(named) if name in space]
    for module in [v for v in found + closure if isinstance(v, types.ModuleType) and _users(v)]:
        found += [getattr(module, name) for name in sorted(attributes)
                  if inspect.isfunction(getattr(module, name, None))]
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


_INSTALLED = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})


def _users(module: types.ModuleType) -> bool:
    """Whether ``module`` is the user's own code (a file not under Python's or site-packages)."""
    path = getattr(module, "__file__", None)
    return isinstance(path, str) and not os.path.abspath(path).startswith(_INSTALLED)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _value_text(value: Any) -> str:
    """``repr(value)`` (its first 200 characters) as every process writes it: without memory
    addresses, where the repr had one (``object``'s own) with the object's attributes instead
    (``__dict__`` and ``__slots__``); a set of strings in sorted order."""
    if isinstance(value, (set, frozenset)) and _hash_ordered(value):
        return f"{type(value).__name__}({sorted(map(repr, value))!r:.200})"
    text = f"{value!r:.200}"
    if _ADDRESS.search(text) is None:
        return text
    attributes = dict(getattr(value, "__dict__", None) or {})
    for slot in getattr(type(value), "__slots__", ()):
        if isinstance(slot, str) and hasattr(value, slot):
            attributes[slot] = getattr(value, slot)
    if attributes:
        text += repr([(k, _value_text(v)) for k, v in sorted(attributes.items())])[:400]
    return _ADDRESS.sub("", text)


def _hash_ordered(value: Any) -> bool:
    """Whether a set's order depends on the process (strings and bytes are hashed with a
    random key each run), not on its values alone."""
    return any(isinstance(v, (str, bytes)) or isinstance(v, tuple) and _hash_ordered(v)
               for v in value)


def _update_code(digest: Any, code: Any) -> None:
    digest.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            _update_code(digest, const)
        else:
            digest.update((_value_text(const) if isinstance(const, frozenset)
                           else repr(const)).encode())
