"""Two values a refusal shows, a long one (a stream's 64 shards, a mixture's schedule of
thousands of steps, a crafted 50 MB string) from just before where the two first differ: cut
alike at a fixed length, they showed the same text and hid the difference."""

from __future__ import annotations

from typing import Any

_SHOWN = 400  # characters of a long value a message shows, from before where it differs


def differ(key: str, expected: Any, received: Any,
           said: tuple[str, str] = ("expected", "received"), text: Any = repr) -> str:
    """``key: expected ..., received ...`` (or ``said``'s words), each value's ``text``, a long
    one shown from just before where the two first differ, both cut alike.

    Example:
        >>> differ("window", 4, 8)
        'window: expected 4, received 8'
        >>> said = differ("s", "a" * 900 + "x", "a" * 900 + "y")
        >>> len(said), said.replace("a" * 100, "<100 a>")
        (233, "s: expected ...<100 a>x', received ...<100 a>y'")
    """
    want, got = text(expected), text(received)
    if len(want) <= 2 * _SHOWN and len(got) <= 2 * _SHOWN:
        return f"{key}: {said[0]} {want}, {said[1]} {got}"
    low, high = 0, min(len(want), len(got))  # the common prefix's length, by halves (in C)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if want[:mid] == got[:mid] else (low, mid - 1)
    start = max(0, low - _SHOWN // 4)

    def cut(text: str) -> str:
        return ("..." if start else "") + text[start:start + _SHOWN] + (
            "..." if len(text) > start + _SHOWN else "")
    return f"{key}: {said[0]} {cut(want)}, {said[1]} {cut(got)}"
