"""What a bound method reads of its object: the attributes its code names on its first argument
(``self.scale``), with those the methods and properties it names there read in turn; ``None``
where the object goes anywhere else (``helper(self)``, ``vars(self)``, ``self.n += 1``,
``super()``), or a name it reads is one whose reads are not followed (a class with its own
``__getattr__``, a ``cached_property``, a slot, a wrapped or cached method, a ``dict``'s
method, a dunder: ``self.__dict__``).

A transform's digest (``code_digest(bound=True)``) takes these attributes' values, not the
whole object: an object that also holds a value of its run (a start time, a run id, a temporary
folder) it does not read made every restore warn that the transforms differ, and the processes
of a run differ (huggingface/datasets#7986 is the same defect of a fingerprint).

Example:
    >>> class Aug:
    ...     def __init__(self):
    ...         self.scale, self.started = 2, 1.5
    ...     def double(self, r):
    ...         return r * self._factor()
    ...     def _factor(self):
    ...         return self.scale
    ...     def escapes(self, r):
    ...         return vars(self)
    >>> sorted(read_names(Aug, Aug.double.__code__)), read_names(Aug, Aug.escapes.__code__)
    (['_factor', 'scale'], None)
"""

from __future__ import annotations

import dis
import inspect
import types
from typing import Any

_LOADS = ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_DEREF", "LOAD_FAST_BORROW")
_READS = ("LOAD_ATTR", "LOAD_METHOD")
_CELLS = ("LOAD_CLOSURE", "MAKE_CELL", "COPY_FREE_VARS")  # (a closure's cell: nested code reads)


def read_names(cls: type, code: Any) -> set[str] | None:
    """The attribute names ``code`` (a method of ``cls``) reads of its first argument, with
    those the methods and properties of ``cls`` it reads read in turn; ``None`` where its
    first argument goes elsewhere, or ``code`` has none."""
    if not code.co_argcount or getattr(cls, "__getattribute__", None) is not \
            object.__getattribute__ or inspect.getattr_static(cls, "__getattr__", None):
        return None  # (its attributes are not what its __dict__ holds)
    read: set[str] = set()
    todo, seen = [(code, code.co_varnames[0])], set()
    while todo:
        now, me = todo.pop()
        if (now, me) in seen:
            continue
        seen.add((now, me))
        names = _reads_of(now, me, todo)
        if names is None:
            return None
        for name in names - read:
            read.add(name)
            member = inspect.getattr_static(cls, name, _ABSENT)
            if member is _ABSENT or isinstance(member, (staticmethod, classmethod)):
                continue  # (the object's own, in its __dict__; or no reader of it)
            function = member.fget if isinstance(member, property) else member
            if isinstance(function, types.FunctionType) and function.__code__.co_argcount \
                    and not hasattr(function, "__wrapped__") and not name.startswith("__"):
                todo.append((function.__code__, function.__code__.co_varnames[0]))
            elif function is member is not None and not hasattr(type(member), "__get__"):
                continue  # (a value of its class's: in the class's text)
            else:
                return None
    return read


_ABSENT = object()


def _reads_of(code: Any, me: str, todo: list) -> set[str] | None:
    """The attributes ``code`` reads of ``me`` (nested code that holds ``me`` in a closure is
    put on ``todo``); ``None`` where ``me`` goes elsewhere than to an attribute's read."""
    if "super" in code.co_names or "__class__" in code.co_freevars:
        return None  # (super(): the parent's methods get the object)
    names: set[str] = set()
    instructions = list(dis.get_instructions(code))
    for i, ins in enumerate(instructions):
        if ins.opname in _CELLS or "LOAD_FAST" in ins.opname and me in code.co_cellvars:
            continue  # (its cell, for a closure: 3.13 loads it by LOAD_FAST, its value by DEREF)
        loaded = ins.argval if isinstance(ins.argval, tuple) else (ins.argval,)
        if me not in loaded or "LOAD_FAST" not in ins.opname and ins.opname not in _LOADS:
            continue  # (LOAD_FAST_LOAD_FAST, 3.13's STORE_FAST_LOAD_FAST: two names, one load)
        after = instructions[i + 1] if i + 1 < len(instructions) else None
        if loaded[-1] != me or after is None or after.opname not in _READS:
            return None
        names.add(after.argval)
    for const in code.co_consts:
        if hasattr(const, "co_code") and me in const.co_freevars:
            todo.append((const, me))
    return names
