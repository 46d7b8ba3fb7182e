"""``held_generators``: the random generators a loader's transforms hold (an augmentation
object's ``self.rng``, a ``random.Random`` or ``torch.Generator`` in a closure, a seeded
pipeline in the project's own module), which ``batching.global_draws.DrawWatch`` watches beside
the global state: a copy of each goes to every worker in one state, so the workers draw the
same numbers. A source's own reads are watched so too (``fingerprint``: its ``__getitem__``).
And ``unseeded_makers``: the generators their code makes without a seed (read from the
bytecode, ``np.random.default_rng()`` each call), whose numbers are the system's entropy.

Example:
    >>> from jaxloader.batching.transforms import Map
    >>> rng = np.random.default_rng(0)
    >>> [(i, where) for i, where, _ in held_generators((Map(lambda r: r + rng.random()),))]
    [(0, 'fn.rng')]
"""

from __future__ import annotations

import dis
import functools
import itertools
import random
import sys
import types
from typing import Any, Iterator

import numpy as np

from jaxloader.sources.code_digest import PACKAGE, filled, named_globals, users_file
from jaxloader.sources.value_text import attributes_of

_GENERATORS = (np.random.Generator, np.random.RandomState, np.random.BitGenerator, random.Random)
_LOOKED_AT = 2000  # objects a transform's search for held generators looks at, at most
_ITEMS = 64  # a container's items it looks at, at most
_MAKERS = {"default_rng", "RandomState", "Random", "SeedSequence", "PCG64", "PCG64DXSM", "Philox",
           "SFC64", "MT19937"}  # a random generator's makers: seeded by the OS with no argument
_SEEDS = {"seed", "bit_generator", "set_state", "setstate"}  # a generator seeded after it is
# made, where the code calls one on a local (g.seed(k); not random.seed, nor cfg.seed read)
_PLAIN = (type, types.ModuleType, np.ndarray, str, bytes, int, float, complex, range)


def unseeded_makers(transforms: tuple) -> list[tuple[int, str, str, str, int]]:
    """The generators ``transforms``' own code makes without a seed (``np.random.default_rng()``,
    ``random.Random()``, in the user's functions ``held_generators`` walks), each as
    ``(transform index, where, what, file, line)``: each call draws from the operating
    system's entropy, which no seed, worker count or restore makes the same again."""
    found = []
    for index, transform in enumerate(transforms):
        for where, fn in _walk(transform, _GENERATORS):
            if type(fn) is not types.FunctionType:  # (first: a proxy's attributes run code)
                continue
            file = fn.__code__.co_filename
            if users_file(file) and not file.startswith(PACKAGE):  # (a library's: its affair)
                found += [(index, where, what, file, line)
                          for what, line in _unseeded(fn.__code__)][:1]
    return found


def _unseeded(code: types.CodeType) -> list[tuple[str, int]]:
    """The calls of no argument in ``code`` (and the functions defined in it) to a name of
    ``_MAKERS``: the name, loaded as a global or an attribute, then the call (3.11's
    ``PRECALL`` and the interpreters' ``CACHE`` between), each with its line; none in code
    that also seeds a local one (``_SEEDS``)."""
    nested = [f for c in code.co_consts if isinstance(c, types.CodeType) for f in _unseeded(c)]
    steps = [i for i in dis.get_instructions(code)
             if i.opname not in ("CACHE", "PRECALL", "PUSH_NULL", "NOP")]
    if any(("LOAD_FAST" in a.opname or a.opname == "LOAD_DEREF") and (b.argval in _SEEDS and (
            b.opname == "LOAD_METHOD" or "NULL|self" in b.argrepr or b.argval == "bit_generator")
            or b.opname == "STORE_ATTR" and b.argval == "state")  # (made, then seeded: g =
           for a, b in zip(steps, steps[1:])):  # Random(); g.seed(k), or g.state = saved)
        return nested
    found = [(f"{name.argval}()", name.positions.lineno or code.co_firstlineno)
             for name, call in zip(steps, steps[1:])
             if name.argval in _MAKERS and name.opname in ("LOAD_ATTR", "LOAD_METHOD",
                                                           "LOAD_GLOBAL", "LOAD_DEREF")
             and call.opname == "CALL" and call.arg == 0 and name.positions is not None]
    return found + nested


def held_generators(transforms: tuple) -> list[tuple[int, str, Any]]:
    """The random generators ``transforms`` hold but the global ones (``global_draws``), each as
    ``(transform index, where, generator)``: in the attributes of an object called or bound
    (``__dict__``, ``__slots__``), in partials and containers, and in the closures, defaults and
    the globals named by the code of the user's own functions (not an installed library's:
    ``tempfile``'s names are drawn from a generator of its own), a few levels down. No
    property or ``__repr__`` of the user's runs, and what cannot be looked at is left out: a
    watch only."""
    found: list[tuple[int, str, Any]] = []
    torch = sys.modules.get("torch")  # (its generators where the user's code imported it)
    generator = getattr(torch, "Generator", None)
    kinds = _GENERATORS + ((generator,) if isinstance(generator, type) else ())
    globals_ = (getattr(random, "_inst", None), getattr(np.random.mtrand, "_rand", None),
                getattr(torch, "default_generator", None))
    for index, transform in enumerate(transforms):
        for where, obj in _walk(transform, kinds):
            if issubclass(type(obj), kinds) and not any(obj is g for g in globals_):
                found.append((index, where, obj))  # (the global ones: draws())
    return found


def _walk(transform: Any, leaves: tuple = ()) -> Iterator[tuple[str, Any]]:
    """What ``transform``'s function holds, a few levels down (``held_generators``), each
    with how it is reached; an object of ``leaves``' kinds is not looked into."""
    todo, seen = [("fn", getattr(transform, "fn", None), 0)], set[int]()
    while todo and len(seen) < _LOOKED_AT:
        where, obj, depth = todo.pop()
        kind = type(obj)  # (not isinstance: a proxy's __class__ may run its code)
        if id(obj) in seen or obj is None or issubclass(kind, _PLAIN):
            continue
        seen.add(id(obj))
        yield where, obj
        if depth < 5 and not issubclass(kind, leaves):
            try:
                todo += [(where + name, child, depth + 1) for name, child in _inside(obj)]
            except Exception:  # noqa: BLE001 - (what cannot be looked at: left out)
                pass


def _inside(obj: Any) -> list[tuple[str, Any]]:
    """What ``obj`` holds, each with how it is reached from it."""
    kind = type(obj)
    if issubclass(kind, types.FunctionType):
        file = obj.__code__.co_filename  # (jaxloader's own are not walked either)
        if not users_file(file) or file.startswith(PACKAGE):
            return []
        closure = [(name, cell.cell_contents) for name, cell in
                   zip(obj.__code__.co_freevars, obj.__closure__ or ()) if filled(cell)]
        return [(f".{name}", value) for name, value in closure + named_globals(  # (augs.TRAIN:
            obj, obj.__code__, [value for _, value in closure], quiet=True)] + [  # a module's)
            (f".__defaults__[{i}]", d) for i, d in enumerate(obj.__defaults__ or ())] + [
            (".__wrapped__", w) for w in [obj.__dict__.get("__wrapped__")] if w is not None]
    if issubclass(kind, types.MethodType):
        return [(".__self__", obj.__self__), ("", obj.__func__)]
    if issubclass(kind, functools.partial):
        return [("", obj.func), *((f".args[{i}]", a) for i, a in enumerate(obj.args)),
                *((f".keywords[{_key(k)}]", v) for k, v in obj.keywords.items())]
    own = {} if kind in (dict, list, tuple, set, frozenset) else attributes_of(obj, True)
    held = [(f".{k}", v) for k, v in itertools.islice(own.items(), _ITEMS)]  # (imgaug's
    # OneOf is a list)
    if issubclass(kind, dict):
        return held + [(f"[{_key(k)}]", v) for k, v in itertools.islice(dict.items(obj), _ITEMS)]
    if issubclass(kind, (list, tuple, set, frozenset)):
        return held + [(f"[{i}]", v) for i, v in enumerate(itertools.islice(obj, _ITEMS))]
    held += [(f".{k}", v) for c in kind.__mro__ if _users_class(c)  # (a class attribute:
             for k, v in itertools.islice(c.__dict__.items(), _ITEMS)  # one for all instances)
             if not k.startswith("__") and k not in own and not callable(v)
             and not isinstance(v, (property, classmethod, staticmethod))]
    call = next((c.__dict__["__call__"] for c in kind.__mro__ if "__call__" in c.__dict__), None)
    return held + ([("", call)] if type(call) is types.FunctionType else [])


def _users_class(kind: type) -> bool:
    """Whether ``kind`` is defined in the user's code (its script, a notebook, its project's
    modules), whose class attributes are looked at: not an installed library's."""
    module = sys.modules.get(kind.__module__)
    if kind.__module__ == "__main__" or module is None:  # (one that came by value: a worker's
        return True  # copy of a class its training process's script defined)
    file = getattr(module, "__file__", None)
    return isinstance(file, str) and users_file(file) and not file.startswith(PACKAGE)


def _key(key: Any) -> str:
    """A key in a name: its ``repr`` where that is plain data's, else ``...``."""
    return repr(key) if type(key) in (str, int, float, bytes, bool) else "..."
