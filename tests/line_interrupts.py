"""Interrupts raised at a chosen line of chosen functions (for tests of interrupt safety).

``Tick`` stands in for ``KeyboardInterrupt``, which pytest would take as the user stopping the
run. ``raised_at_line`` runs a call with a tracer that raises ``Tick`` at the ``n``-th line
executed inside the given functions, so a test can put an interrupt between every two lines of
a piece of bookkeeping in turn, deterministically. ``raised_at_point`` does the same at the
points of a whole package where a real Ctrl-C can land, for sweeps of whole calls.
"""

from __future__ import annotations

import dis
import sys
from typing import Any, Callable


class Tick(BaseException):
    pass


def raised_at_line(n: int, functions: list[Callable[..., Any]], call: Callable[[], Any]) -> bool:
    """BatchRuns ``call()``, raising ``Tick`` at the ``n``-th line run inside ``functions``; True if
    it was raised (False: ``call`` ran fewer lines there, and finished)."""
    codes = {f.__code__ for f in functions}
    seen = 0

    def tracer(frame, event, arg):
        if frame.f_code not in codes:
            return None

        def line(frame, event, arg):
            nonlocal seen
            if event == "line":
                seen += 1
                if seen == n:
                    raise Tick()
            return line
        return line

    return _raised(tracer, call)


def raised_at_point(n: int, package: str, call: Callable[[], Any]) -> bool:
    """BatchRuns ``call()``, raising ``Tick`` at the ``n``-th point inside the code of ``package``
    (a directory) where CPython may run a signal handler: a function's start, just after a
    call returns (a builtin's or a function's; the latter is finer than CPython, which checks
    there only after builtins) and a loop's back edge; True if it was raised. Between two such
    points (stores, arithmetic, a ``return``) a real Ctrl-C cannot land, which a line-by-line
    tracer does not know."""
    seen = 0

    def hit() -> None:
        nonlocal seen
        seen += 1
        if seen == n:
            raise Tick()

    def tracer(frame, event, arg):
        if not frame.f_code.co_filename.startswith(package):
            return None
        frame.f_trace_opcodes = True
        hit()  # the function's start
        after_call = False

        def opcode(frame, event, arg):
            nonlocal after_call
            frame.f_trace_opcodes = True  # (3.12+: set at the call event, it starts late)
            if event == "opcode":
                name = dis.opname[frame.f_code.co_code[frame.f_lasti]]
                if after_call or name == "JUMP_BACKWARD":
                    after_call = False
                    hit()
                after_call = name in _CALLS
            return opcode
        return opcode

    # (also raised where Python prints and drops it: in a generator the GC closes)
    return _raised(tracer, call) or seen >= n


_CALLS = {"CALL", "CALL_KW", "CALL_FUNCTION_EX"}


def _raised(tracer: Callable[..., Any], call: Callable[[], Any]) -> bool:
    """BatchRuns ``call()`` under ``tracer``; True if ``Tick`` came out of it."""
    sys.settrace(tracer)
    try:
        call()
    except Tick:
        return True
    finally:
        sys.settrace(None)
    return False
