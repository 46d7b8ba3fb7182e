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

import builtins
import dis
import functools
import hashlib
import inspect
import os
import site
import sys
import sysconfig
import types
import warnings
from typing import Any

from jaxloader.base.checks import callable_name
from jaxloader.base.errors import JaxloaderWarning, user_stacklevel
from jaxloader.sources.class_text import class_text, unwrapped
from jaxloader.sources.owner_reads import read_names
from jaxloader.sources.value_text import (CONTAINERS_WRITTEN, PLACES_LEFT_OUT, SETS_AS_BEFORE,
                                          value_text, written)


def code_digests(fn: Any) -> tuple[str, ...]:
    """``code_digest(fn)`` as this version takes it, as versions until 2026-12-02's
    forty-fifth session did (``methods=False``), until 2026-12-01's fortieth (also
    ``code_as_before``), as 2026-11-30's thirty-fourth session's did (also ``tails=False``), as
    its thirty-third's did (also ``sets_as_before``) and as versions before it did (also no
    defaults): what states saved by each hold (indexed by ``base.abilities.digest_level()``)."""
    return (code_digest(fn), *(code_digest(fn, methods=False, **form) for form in OLDER_FORMS))


OLDER_FORMS: tuple[dict[str, bool], ...] = (
    {}, {"code_as_before": True}, {"tails": False, "code_as_before": True},
    {"sets_as_before": True, "tails": False, "code_as_before": True},
    {"defaults": False, "sets_as_before": True, "tails": False, "code_as_before": True})
"""``code_digest``'s settings (with ``methods=False``) of each older digest level, the
newest first: ``base.abilities.OLDER_DIGESTS`` 1 to 5."""


def code_digest(fn: Any, deep: bool = False, bound: bool = False, defaults: bool = True,
                sets_as_before: bool = False, tails: bool = True,
                code_as_before: bool = False, methods: bool = True,
                whole_owner: bool = False) -> str:
    """A digest of ``fn``: its name, source text (where Python has it: a script's or a notebook's),
    the names and constants its code uses (nested functions' too: two lambdas on one line), its
    closure's values and default arguments' (``lambda r, m=m: ...``; a ``functools.partial``: its
    function and arguments); for another callable, its type and ``repr`` too. Not its bytecode,
    which differs between Python versions; the names and constants as sets, the same from
    Python 3.11 on (3.12 compiles a comprehension into its function's own code, where 3.11 made
    a function of it: they are listed in other places).

    ``deep``: also the values of the globals its code names, the functions and values of the
    user's own modules (not installed ones) it names, and a bound method's object, each whole
    (an array by its bytes, not its ``repr``'s first characters): what a predicate reads beyond
    its closure, for a file kept from it. Not for states: a global object whose ``repr``
    changes from run to run would refuse a resume.

    ``bound``: also a bound method's object as its code reads it (``owner_reads``: the
    attributes it reads, through its methods too; where it passes the object on, the object:
    its ``repr``, or its attributes where that has an address), a Grain transform's
    parameters; so does ``deep``. ``whole_owner``: the object whole, as versions until
    2026-12-04 took it (a start time it held and did not read: each restore warned).

    ``defaults=False``: not default arguments, as versions until 2026-11-30 digested (what a
    state saved then holds: ``base.abilities.OLDER``). ``sets_as_before``: a set of values
    other than strings, ``Enum`` members and dataclasses in its run's order, as versions until
    2026-11-30's thirty-fourth session wrote it. ``tails=False``: a value's text cut at 200
    characters, with no digest of the rest (a closure's list of files that grew at its end
    went unseen), as versions until 2026-11-30's thirty-fifth session took it.
    ``code_as_before``: the code's names and constants in the order and places each Python
    lists them, as versions until 2026-12-01's fortieth session took them (another digest
    under 3.11 than under 3.12 and later for a function with a comprehension).
    ``methods=False``: a callable object whose class has no source Python can find (one
    defined in a notebook's cell) by its ``__call__``'s names and constants alone, not its
    class's text from its cell (``class_text``), as versions until 2026-12-02's
    forty-fifth session took it (an edited operator, ``+`` to ``-``, went unseen); and an
    ``OrderedDict``, ``deque``, ``ChainMap``, ``mappingproxy`` or object array by its ``repr``,
    as versions until 2026-12-03 took them (``value_text.CONTAINERS_WRITTEN``: an
    ``OrderedDict``'s changed in Python 3.12, a set of strings in one in its run's order).
    """
    token, places = SETS_AS_BEFORE.set(sets_as_before), PLACES_LEFT_OUT.set(methods)
    written_ = CONTAINERS_WRITTEN.set(methods)  # (every older level wrote them by repr)
    try:
        return _Digests(deep, bound, defaults, tails, code_as_before, methods,
                        whole_owner).of(fn, frozenset())
    finally:
        SETS_AS_BEFORE.reset(token)
        PLACES_LEFT_OUT.reset(places)
        CONTAINERS_WRITTEN.reset(written_)


class _Digests:
    """The digests of one ``code_digest`` call, each function's once (a helper called from
    many places, a function that calls itself)."""

    def __init__(self, deep: bool, bound: bool = False, defaults: bool = True,
                 tails: bool = True, code_as_before: bool = False, methods: bool = True,
                 whole_owner: bool = False) -> None:
        self.deep, self.bound, self.defaults, self.tails = deep, bound, defaults, tails
        self.code_as_before, self.methods, self.whole_owner = code_as_before, methods, whole_owner
        self.done: dict[int, str] = {}

    def of(self, fn: Any, within: frozenset) -> str:
        if id(fn) in self.done:
            return self.done[id(fn)]
        within = within | {id(fn)}
        digest = hashlib.blake2b(digest_size=16)
        if isinstance(fn, functools.partial):
            digest.update(b"partial:" + self.of(fn.func, within).encode())
            digest.update(value_text((fn.args, sorted(fn.keywords.items())), self.deep,
                                     tail=self.tails).encode())
            self.done[id(fn)] = found = digest.hexdigest()
            return found
        code = getattr(fn, "__code__", None)
        own = code is not None  # (its own code and source, else its class's)
        if code is None:
            call = getattr(type(fn), "__call__", None)
            inner = unwrapped(fn) if self.methods else fn  # (jax.jit(f), lru_cache(f): f)
            held = value_text(fn, tail=self.tails) if inner is fn or users_code(
                inspect.getmodule(type(fn))) else ""  # (a library's wrapper: not its text,
            digest.update(f"{type(fn).__qualname__}:{held}".encode())  # f's file and line)
            code = getattr(unwrapped(call) if self.methods else call, "__code__", None)
            own = not self.methods and code is None
            if inner is not fn and callable(inner) and id(inner) not in within:
                digest.update(b"wraps:" + self.of(inner, within).encode())  # (versions until
                # 2026-12-02's 45th session took f's source alone, a wrapper class's neither)
        else:
            digest.update(getattr(fn, "__qualname__", "").encode())
        try:
            digest.update(inspect.getsource(fn if own else type(fn)).encode())
        except (OSError, TypeError):  # (no source: built by exec, the interpreter's prompt,
            if self.methods and not own:  # a notebook's class)
                digest.update(_methods_text(type(fn)).encode())
        if code is not None and self.code_as_before:
            _update_code(digest, code)
        elif code is not None:
            digest.update(_code_text(code).encode())
        closure = [cell.cell_contents for cell in getattr(fn, "__closure__", None) or ()
                   if filled(cell)]
        for value in closure + (_defaults(fn) if self.defaults else []):
            if id(value) not in within:
                digest.update(self._value(value, within).encode())
        owner = getattr(fn, "__self__", None)
        if self.deep:
            for value in [owner, *_globals_named(fn, code, closure)]:
                if id(value) not in within and not isinstance(value, types.ModuleType):
                    digest.update((self._owner(value, code, within) if value is owner else
                                   self._value(value, within)).encode())
        elif self.bound and owner is not None and id(owner) not in within and not isinstance(
                owner, types.ModuleType):
            digest.update(self._owner(owner, code, within).encode())
        self.done[id(fn)] = found = digest.hexdigest()
        return found

    def _owner(self, owner: Any, code: Any, within: frozenset) -> str:
        """A bound method's object as its ``code`` reads it (``owner_reads``: those attributes'
        values, its classes' text), else whole (``_value``)."""
        held: Any = getattr(owner, "__dict__", None)  # (__slots__, or passed on: whole)
        if self.whole_owner or code is None or not isinstance(held, dict) or (
                names := read_names(type(owner), code)) is None:
            return self._value(owner, within)
        return _methods_text(type(owner)) + repr([(name, self._value(
            held[name], within | {id(owner)})) for name in sorted(names) if name in held])

    def _value(self, value: Any, within: frozenset) -> str:
        if not callable(value):
            return value_text(value, self.deep, tail=self.tails)
        if self.deep and inspect.isfunction(value) and not users_code(
                inspect.getmodule(value)):  # (an installed library's: by its name)
            return f"{value.__module__}.{value.__qualname__}"
        return self.of(value, within)


def _methods_text(cls: type) -> str:
    """``class_text`` of each of the user's classes ``cls`` derives from, its own first (not
    ``object``, nor an installed library's base)."""
    return "".join(class_text(klass, users_file, value_text) for klass in cls.__mro__
                   if users_code(inspect.getmodule(klass)))


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
    """The values of ``named_globals``."""
    return [value for _, value in named_globals(fn, code, closure)]


def named_globals(fn: Any, code: Any, closure: list,
                  quiet: bool = False) -> list[tuple[str, Any]]:
    """The globals ``code`` names (nested code's too), and what it names through a user's
    module (not an installed one), a global or in the ``closure``, each with its name
    (``module.name`` for the latter). ``quiet``: running no code of the user's (a module's
    ``__getattr__``, a proxy's ``__class__``), jaxloader's modules left out, and a name the code
    imports from a user's module too (``from augs import TRAIN`` in a function): for the
    search of held generators, where the digest reads them as it always did."""
    space = getattr(fn, "__globals__", None) or getattr(
        getattr(type(fn), "__call__", None), "__globals__", None) or {}
    named: set[str] = set()
    attributes: set[str] = set()
    if code is not None:
        _names(code, named, attributes, quiet)
    found = [(name, space[name] if name in space else sys.modules[name]) for name in sorted(
        named) if name in space or (quiet and name in sys.modules)]  # (one imported in it)
    for label, module in found + [("", v) for v in closure]:
        if not (issubclass(type(module), types.ModuleType) if quiet else isinstance(
                module, types.ModuleType)):
            continue
        if quiet:
            try:
                held = vars(module)
                if not users_code(types.SimpleNamespace(**{
                        k: held[k] for k in ("__file__", "__name__") if k in held})) or str(
                            held.get("__file__")).startswith(PACKAGE):
                    continue
                label = label or str(held.get("__name__") or "<module>")
                found += [(f"{label}.{name}", held[name]) for name in sorted(attributes)
                          if name in held and not issubclass(type(held[name]),
                                                             types.ModuleType)]
            except Exception:  # noqa: BLE001 - (what cannot be read is left out)
                pass
        elif users_code(module):
            label = label or getattr(module, "__name__", "")
            found += [(f"{label}.{name}", getattr(module, name)) for name in sorted(attributes)
                      if hasattr(module, name) and not isinstance(getattr(module, name),
                                                                  types.ModuleType)]
    return found


def _names(code: Any, named: set[str], attributes: set[str], imports: bool = False) -> None:
    """The global names ``code`` loads (not an attribute that has a global's name), and the
    attribute names it loads (``module.function``), nested code's too; ``imports``: a module
    it imports as a global it names, and a name it imports from one as an attribute."""
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            named.add(instruction.argval)
        elif instruction.opname in ("LOAD_ATTR", "LOAD_METHOD"):
            attributes.add(instruction.argval)
        elif imports and instruction.opname == "IMPORT_NAME":
            named.add(instruction.argval)
        elif imports and instruction.opname == "IMPORT_FROM":
            attributes.add(instruction.argval)
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            _names(const, named, attributes, imports)


def _installed() -> tuple[str, ...]:
    paths = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib",
                                                     "platlib")}
    paths |= set(getattr(site, "getsitepackages", list)())
    paths.add(getattr(site, "getusersitepackages", str)())
    return tuple(os.path.abspath(p) for p in paths if p)


_INSTALLED = _installed()
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # jaxloader's


def users_code(module: Any) -> bool:
    """Whether ``module`` is the user's own code (``users_file``), or a notebook's ``__main__``
    (no file), or code whose module is not known (built by ``exec``)."""
    if module is None:
        return True
    path = getattr(module, "__file__", None)
    if not isinstance(path, str):
        return getattr(module, "__name__", None) == "__main__"
    return users_file(path)


def users_file(path: str) -> bool:
    """Whether ``path`` is not under Python's library or a site-packages or dist-packages
    folder (a function's code's file: ``functools.wraps`` copies the user's ``__module__``
    onto a library's wrapper)."""
    path = os.path.abspath(path)
    parts = path.split(os.sep)
    return not path.startswith(_INSTALLED) and "site-packages" not in parts and (
        "dist-packages" not in parts)


def _code_text(code: Any) -> str:
    """The names and constants ``code`` and the code nested in it (its functions', lambdas'
    and comprehensions') use, each set sorted, as its instructions load them: the same under
    every Python from 3.11, which lists others beside them (3.11 keeps what it folded or cut
    away, a nested function's defaults one by one; 3.12 inlines a comprehension, and joins an
    f-string's nested format spec to ``""``; 3.13 gives a class body its first line; 3.14
    loads a small int without listing it), ``None`` and ``""`` left out. Less than their
    order says: where there is no source text, two functions that differ by their constants'
    places alone (``r[0] - r[1]``, ``r[1] - r[0]``) have one digest."""
    names: set[str] = set()
    constants: set[str] = set()
    _code_sets(code, names, constants)
    return repr((sorted(names), sorted(constants)))


_LISTED = {"__firstlineno__", "__static_attributes__"}  # (3.13's class bodies: not the code's)
_CONSTANT = set(dis.hasconst) | {dis.opmap.get("LOAD_SMALL_INT", -1)}


def _code_sets(code: Any, names: set[str], constants: set[str]) -> None:
    instructions = list(dis.get_instructions(code))
    for at, instruction in enumerate(instructions):
        then = instructions[at + 1] if at + 1 < len(instructions) else None
        if then is not None and then.argval in _LISTED and then.opname == "STORE_NAME":
            continue  # (a class body's line, its attributes' names: 3.13's alone)
        value = instruction.argval
        if instruction.opcode in _CONSTANT:  # (by its index: 3.11's dis says "<unknown>" for
            value = code.co_consts[instruction.arg] if (  # KW_NAMES' names)
                instruction.opcode in dis.hasconst) else instruction.arg
            if hasattr(value, "co_code"):
                _code_sets(value, names, constants)
            elif value is not None and value != "":  # (3.12 joins a nested f-string's spec
                constants.add(value_text(value) if isinstance(value, frozenset) else written(
                    value))  # to an empty one)
        elif instruction.opcode in dis.hasname and value not in _LISTED:
            names.add(value)


def _update_code(digest: Any, code: Any) -> None:
    digest.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            _update_code(digest, const)
        else:
            digest.update((value_text(const) if isinstance(const, frozenset)
                           else written(const)).encode())


def warn_hashing(fn: Any, where: str) -> None:
    """Warns where ``fn``'s code (nested functions' too) calls the built-in ``hash``, whose value
    for a str or bytes Python draws anew in each process (unless ``PYTHONHASHSEED`` is set): a
    fold kept by ``hash(r["user"]) % 5`` held other records with workers than without, and in
    each run (the Parquet audit)."""
    if _fixed_hash_seed():
        return
    while isinstance(fn, functools.partial):
        fn = fn.func
    code = getattr(fn, "__code__", None) or getattr(getattr(type(fn), "__call__", None),
                                                     "__code__", None)
    if code is None:
        return
    named: set[str] = set()
    _names(code, named, set())
    space = getattr(fn, "__globals__", None) or getattr(type(fn).__call__, "__globals__", {})
    if "hash" in named and space.get("hash", builtins.hash) is builtins.hash:
        warnings.warn(
            f"{where}: {callable_name(fn)} calls hash(), whose value "
            "for a str or bytes Python draws anew in each process: it gives other values in "
            "workers than in this process, and in each run, so the records kept or made differ "
            "there and after a restore; hash text with zlib.crc32(s.encode()) or hashlib, or "
            "set PYTHONHASHSEED=0 before Python starts (numbers hash the same everywhere)",
            JaxloaderWarning,
            stacklevel=user_stacklevel())


def _fixed_hash_seed() -> bool:
    """Whether this process's str hashes are the same as its workers': ``PYTHONHASHSEED`` a
    number as this process started (its start's environment, where the system keeps it: one set
    in ``os.environ`` later reaches the workers alone) and as it is now, which they inherit."""
    now = os.environ.get("PYTHONHASHSEED", "random")
    if not now.isdigit() or sys.flags.ignore_environment:  # (python -E, -I: not read here)
        return False
    try:
        with open("/proc/self/environ", "rb") as f:
            started = dict(entry.partition(b"=")[::2] for entry in f.read().split(b"\0"))
        return started.get(b"PYTHONHASHSEED") == now.encode()
    except OSError:  # (no /proc: 0, Python's flag says; another number is taken as given)
        return not sys.flags.hash_randomization or now != "0"
