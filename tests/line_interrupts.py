"""Interrupts raised at a chosen line of chosen functions (for tests of interrupt safety).

``Tick`` stands in for ``KeyboardInterrupt``, which pytest would take as the user stopping the
run. ``raised_at_line`` runs a call with a tracer that raises ``Tick`` at the ``n``-th line
executed inside the given functions, so a test can put an interrupt between every two lines of
a piece of bookkeeping in turn, deterministically.
"""

from __future__ import annotations

import sys
from typing import Any, Callable


class Tick(BaseException):
    pass


def raised_at_line(n: int, functions: list[Callable[..., Any]], call: Callable[[], Any]) -> bool:
    """Runs ``call()``, raising ``Tick`` at the ``n``-th line run inside ``functions``; True if
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

    sys.settrace(tracer)
    try:
        call()
    except Tick:
        return True
    finally:
        sys.settrace(None)
    return False
