"""``class_text``: the text of a class defined in a notebook's cell, which Python finds none of.

``inspect.getsource`` finds a class's text through its module's file, and a notebook's
``__main__`` has none, so a callable object of a class defined in a cell was digested
(``code_digest``) by its ``__call__``'s names and constants alone: an edited operator, a class
attribute's value, a decorated method went unseen at a restore. Its functions' code names the
cell's own file, whose lines the kernel keeps (``linecache``): the class's block is read from
there, and each of its functions' text too (one assigned to the class after it was made).

Example:
    >>> class Scale:
    ...     K = 2
    >>> class_text(Scale, lambda path: True, repr)  # (no function, no text kept: its value)
    'K = 2\\n'
"""

from __future__ import annotations

import ast
import functools
import inspect
import linecache
from typing import Any, Callable


def class_text(klass: type, users: Callable[[str], bool],
               text: Callable[[Any], str]) -> str:
    """``klass``'s block, read from the cell its functions' code names (``""`` where it is not
    kept there), the text of each function it holds whose file is the user's (``users``: not
    the standard library's, a dataclass's ``__replace__``), each after its name; where no
    block is kept, the text (``text``) of each of its values (a subclass that sets ``K = 3``
    alone: no function to find its cell by)."""
    functions = [(name, part) for name, value in sorted(vars(klass).items())
                 for part in _functions(value) if users(part.__code__.co_filename)]
    texts = [_block(klass, [f for _, f in functions])]
    if not texts[0]:  # (else in its text: a set's dict, a memo filled, differ by run)
        texts += [f"{name} = {text(value)}\n" for name, value in sorted(vars(klass).items())
                  if not name.startswith("__") and not _functions(value) and not isinstance(
                      value, (staticmethod, classmethod, property, functools.cached_property))]
    for name, part in functions:
        try:
            texts.append(f"{klass.__qualname__}.{name}: {inspect.getsource(part)}")
        except (OSError, TypeError):  # (a dataclass's made methods: no text)
            pass
    return "".join(texts)


def _functions(value: Any) -> list[Any]:
    """The plain functions a class's attribute holds: a method's, a static or class
    method's, a property's, a ``cached_property``'s, each unwrapped (``lru_cache``,
    ``jax.jit``)."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    parts = ([value.fget, value.fset, value.fdel] if isinstance(value, property) else
             [value.func] if isinstance(value, functools.cached_property) else [value])
    return [part for part in map(unwrapped, parts) if inspect.isfunction(part)]


def unwrapped(fn: Any) -> Any:
    """``fn`` under its wrappers (``functools.wraps``' ``__wrapped__``: ``lru_cache``,
    ``jax.jit``), or itself."""
    try:
        return inspect.unwrap(fn) if callable(fn) else fn
    except ValueError:  # (a cycle of __wrapped__)
        return fn


def _first_line(lines: list[str], name: str, within: int) -> int | None:
    """The first line of the class ``name`` (its decorators', as 3.13's ``__firstlineno__``
    counts them) whose block holds line ``within`` (its function's: one cell may make it
    twice), the innermost; ``None`` where the text does not parse."""
    try:
        tree = ast.parse("".join(lines))
    except (SyntaxError, ValueError):  # (a cell's magics, as the kernel kept them)
        return None
    starts = [min([node.lineno, *(d.lineno for d in node.decorator_list)])
              for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == name
              and node.lineno <= within <= (node.end_lineno or node.lineno)]
    return max(starts, default=None)


def _block(klass: type, functions: list[Any]) -> str:
    """``klass``'s block in the cell its ``functions``' code names (``""`` where none does,
    or the lines are not kept): from ``__firstlineno__`` (Python 3.13), else ``_first_line``;
    its values' text with it (``K = 2``, a table)."""
    own = [f for f in functions if f.__qualname__.startswith(f"{klass.__qualname__}.")]
    for function in own or functions:  # (those its body defines first: one assigned to it
        lines = linecache.getlines(function.__code__.co_filename)  # may be another cell's)
        first = vars(klass).get("__firstlineno__")
        if first is None:  # (3.11, 3.12)
            first = _first_line(lines, klass.__name__, function.__code__.co_firstlineno)
        if lines and first is not None and 0 < first <= len(lines):
            try:
                return "".join(inspect.getblock(lines[first - 1:]))
            except Exception:  # noqa: BLE001 - (a text the tokenizer cannot read)
                return ""
    return ""
