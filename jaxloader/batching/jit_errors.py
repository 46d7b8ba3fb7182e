"""A ``JitMap``'s function as the user wrote it: whether it takes a key (``takes_key``), and
where it failed, for its error: the user's own line (a traceback's innermost frame in the
function's file), through what wraps the function.

Example:
    >>> import functools
    >>> def scale(record, k):
    ...     return record * k
    >>> code_of(functools.partial(scale, k=2)).co_name
    'scale'
"""

from __future__ import annotations

import inspect
import linecache
import re
import traceback
from typing import Any, Callable


def user_line(e: BaseException, fn: Callable[..., Any], file: str | None) -> str:
    """`` at file:line: `code``` for the innermost frame of ``e`` in ``fn``'s file (named
    ``file``: where it was defined, before pickling)."""
    code = code_of(fn)
    if code is None:
        return ""
    found = None
    cause: BaseException | None = e
    while cause is not None and found is None:
        frames = [f for f in traceback.extract_tb(cause.__traceback__)
                  if f.filename == code.co_filename]
        found = frames[-1] if frames else None
        cause = cause.__cause__ or cause.__context__
    if found is None:
        return ""
    file = file or found.filename
    line = (found.line or linecache.getline(file, found.lineno or 0)).strip()
    return f" at {file}:{found.lineno}" + (f": `{line}`" if line else "")


def code_of(fn: Any) -> Any:
    """The code the user wrote of ``fn``: a function's own, or that of what it wraps (a
    ``functools.partial``, a ``jax.jit``, a decorator's ``functools.wraps``: what it wraps, not
    the decorator's module) or of its class's ``__call__``; ``None`` if none."""
    for _ in range(6):
        wrapped = getattr(fn, "__wrapped__", None)
        code = getattr(fn, "__code__", None) if wrapped is None else None
        if code is not None:
            return code
        fn = wrapped or getattr(fn, "func", None) or getattr(type(fn), "__call__", None)
    return None


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def error_text(e: BaseException) -> str:
    """The line of ``e``'s message that says what failed: its first; where that opens a Python
    traceback held in the text (an error raised in a ``jax.debug.callback``, which XLA passes
    on as text), the error it ends with and its innermost frame.

    Example:
        >>> text = ["INTERNAL: CpuCallback error: Traceback (most recent call last):",
        ...         '  File "a.py", line 5, in check', "ValueError: record 9 is bad"]
        >>> error_text(RuntimeError("\\n".join(text)))
        'INTERNAL: CpuCallback error: ValueError: record 9 is bad (a.py:5, in check)'
    """
    lines = str(e).splitlines()
    if not lines:
        return ""
    opening, marker, _ = lines[0].partition("Traceback (most recent call last):")
    if not marker:
        return lines[0]
    last = next((line for line in reversed(lines) if line.strip() and not line[0].isspace()),
                "")
    frames = _FRAME.findall(str(e))
    where = f" ({frames[-1][0]}:{frames[-1][1]}, in {frames[-1][2]})" if frames else ""
    return f"{opening}{last}{where}"


def takes_key(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes two positional arguments without defaults (a record and a key), or
    ``*args``.

    Example:
        >>> takes_key(lambda r, key: r), takes_key(lambda r: r), takes_key(lambda r, k=2: r)
        (True, False, False)
    """
    return key_by(fn) in ("signature", "*args")


def key_by(fn: Callable[..., Any]) -> str | None:
    """Why ``fn`` is given a key: ``"signature"`` (two positional parameters without defaults),
    ``"*args"`` (it takes any: a wrapper without ``functools.wraps``, ``partial(model.apply,
    params)``, whose errors then say so); or why it may be meant to be and is not:
    ``"default"`` (a second one named as a key has a default, ``fn(record, key=None)``: it is
    warned of); else ``None``."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: one argument
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len([p for p in positional if p.default is p.empty]) >= 2:  # (fn(r, factor=2.0): no
        return "signature"  # key; random=True says so)
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return "*args"
    return "default" if len(positional) >= 2 and positional[1].name.lower() in (
        "key", "rng", "prng_key", "rng_key", "prng", "random_key") else None


MANY_SHAPES = 64  # a JitMap compiled for this many input shapes in one process is warned of
# (a Pad's buckets of 64 up to a context of 4,096: 64 shapes; lengths unbucketed: thousands)


def many_shapes(transform: Any, shapes: list[tuple]) -> str:
    """The warning for a ``JitMap`` compiled for ``MANY_SHAPES`` input shapes: a leaf whose
    shape changed between the last two (``shapes``, in order: each ``(rows, ((path, row
    shape, dtype), ...))``) and the remedy; the same text in every worker (said once).

    Example:
        >>> many_shapes("JitMap(f)", [(4, (("['x']", (3,), "float32"),)),
        ...                           (4, (("['x']", (5,), "float32"),))]).split(":")[1]
        " compiled for 2 shapes of its input in a process (leaf ['x'] changes shape)"
    """
    now, then = shapes[-1][1], shapes[-2][1]
    changed = next((f"leaf {path} changes shape" for (path, shape, _), (_, old, _) in zip(
        now, then) if shape != old), "its chunks' rows change")
    return (f"{transform}: compiled for {len(shapes)} shapes of its input in a process "
            f"({changed}): a batch of a new shape waits for XLA's compile (tens of ms), and "
            "each shape's program stays in memory; give the records fewer shapes before it: "
            "a Pad's larger multiple_of= or a fixed length=, or crops and resizes of fixed "
            "sizes in a Map")
