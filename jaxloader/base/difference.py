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


class _Absent:
    def __repr__(self) -> str:
        return "nothing (no such key)"


ABSENT = _Absent()  # (a key one side lacks, as ``differ`` shows it)


def first_apart(key: str, expected: Any, received: Any) -> tuple[str, Any, Any]:
    """Where two JSON-like values first differ: the path under ``key`` (through dicts of the
    same keys, lists of the same length) and the two values there, for ``differ``; a stream's
    description of 400 characters, given whole, hid the one parameter that differed.

    Example:
        >>> first_apart("stream", {"mix": [{"w": 1}, {"w": 2}], "bins": 16},
        ...             {"mix": [{"w": 1}, {"w": 2}], "bins": 8})
        ("stream['bins']", 16, 8)
        >>> first_apart("stream", {"packed": {}, "bins": 8}, {"shards": []})  # (other kinds)
        ('stream', {'packed': {}, 'bins': 8}, {'shards': []})
    """
    while expected != received:
        if isinstance(expected, dict) and isinstance(received, dict):
            if not expected.keys() & received.keys():  # (other kinds: a packed stream's and
                break  # a plain one's, said whole)
            name = next(k for k in [*expected, *received]
                        if expected.get(k, ABSENT) != received.get(k, ABSENT))
            if name not in expected or name not in received:  # (a parameter one holds)
                return f"{key}[{name!r}]", expected.get(name, ABSENT), received.get(name, ABSENT)
        elif isinstance(expected, list) and isinstance(received, list) and \
                len(expected) == len(received):
            name = next(i for i, (a, b) in enumerate(zip(expected, received)) if a != b)
        else:
            break
        key, expected, received = f"{key}[{name!r}]", expected[name], received[name]
    return key, expected, received


def keys_apart(first: Any, other: Any) -> str | None:
    """What the mapping treedef ``other``'s keys lack and hold beyond ``first``'s (ten of
    each, then how many more), or ``None`` where either is no mapping: two lists of 5,000 keys
    each, side by side, hid the one that differed.

    Example:
        >>> keys_apart(("dict", ("a", "b", "c"), ()), ("dict", ("a", "d"), ()))
        "lacks ['b', 'c'] and has ['d'], which the other lacks"
    """
    if not {first[0], other[0]} <= {"dict", "ordered", "defaultdict"}:
        return None
    want, got = set(first[1]), set(other[1])  # (1 and '1' differ, as their records do)

    def shown(keys: set) -> str:
        listed = sorted(keys, key=repr)
        return "[" + ", ".join(map(repr, listed[:10])) + (
            f", ... {len(listed) - 10:,} more]" if len(listed) > 10 else "]")
    apart = [f"lacks {shown(want - got)}"] if want - got else []
    apart += [f"has {shown(got - want)}, which the other lacks"] if got - want else []
    return " and ".join(apart) or (f"has the same keys, in {MAPPING_SAID[other[0]]} (not "
                                   f"{MAPPING_SAID[first[0]]})")


# a mapping treedef kind, as messages name it
MAPPING_SAID = {"dict": "a dict", "ordered": "an OrderedDict", "defaultdict": "a defaultdict"}
