"""What a record's leaf gives the hash of a state's records (``fingerprint``): the bytes that
hold its values, and none of those a dtype leaves unset.

Example:
    >>> import numpy as np
    >>> padded = np.zeros(1, np.dtype([("a", "i1"), ("b", "f8")], align=True))
    >>> len(leaf_bytes(padded))  # (9 bytes of values of its 16)
    9
"""

from __future__ import annotations

import contextvars
from typing import Any

import numpy as np

from jaxloader.base.abilities import RECORDS_AS_BEFORE


def records_as_before() -> bool:
    """Whether records are hashed as versions until 2026-12-07's eleventh session hashed
    them (``RECORDS_AS_BEFORE``)."""
    return RECORDS_AS_BEFORE.get()


def as_numpy(leaf: Any) -> Any:
    """A Python number as NumPy's (an int past 64 bits as it is); any other leaf as it is."""
    if type(leaf) not in (bool, int, float, complex):
        return leaf
    try:
        value = np.asarray(leaf)
    except OverflowError:  # (an int past 64 bits: as it is)
        return leaf
    return leaf if value.dtype.hasobject else value  # (NumPy 2's of such an int: as it is)


ITEMS = 4096  # an object array's items hashed at most (evenly spaced, its last too)
MEANT_SEEN: contextvars.ContextVar[list | None] = contextvars.ContextVar("meant_seen",
                                                                        default=None)
"""Set to a list to learn whether a leaf was hashed otherwise than before 2026-12-07's
eleventh session (``_meant``): a file kept by that version then says the older form."""


def leaf_bytes(leaf: Any) -> bytes:
    """The bytes of ``leaf``'s values: an array's (``_meant``'s where a dtype leaves bytes
    unset or holds objects), a str's, a number's text; ``b""`` for another object."""
    if isinstance(leaf, (np.ndarray, np.generic)) and not records_as_before() and (
            _unset(leaf.dtype) or leaf.dtype.hasobject):
        if (seen := MEANT_SEEN.get()) is not None:
            seen.append(leaf.dtype)
        return _meant(leaf)
    if isinstance(leaf, (np.ndarray, np.generic)) and not leaf.dtype.hasobject:
        return np.ascontiguousarray(leaf).tobytes()
    if isinstance(leaf, str):
        return leaf.encode(errors="surrogatepass")  # (a name not in UTF-8: os.fsdecode's)
    if isinstance(leaf, (bytes, bool, int, float, complex)):
        return leaf if isinstance(leaf, bytes) else repr(leaf).encode()
    return b""  # other objects: their type is in the spec; a repr may hold an address


def _meant(leaf: np.ndarray | np.generic, within: frozenset = frozenset()) -> bytes:
    """The bytes that hold ``leaf``'s values, not those a dtype leaves unset (an aligned
    structure's padding, a long double's last 6 of 16: other bytes each read, the source taken
    for one that draws as it reads, its values then unhashed), and an object array's items
    (an array of strings was left out: a state restored over other text): a structure field
    by field, a long double as two float64s (its value and what that left), objects each
    (``within``: the object arrays being hashed around it: one held again is not)."""
    if leaf.dtype.names:
        return b"".join(leaf_bytes(np.asarray(leaf)[name]) for name in leaf.dtype.names)
    if leaf.dtype.hasobject:
        items = np.ravel(leaf)
        if len(items) > ITEMS:  # (a million strings: 5 s a state, each form again)
            items = items[np.unique(np.linspace(0, len(items) - 1, ITEMS).astype(np.int64))]
        within = within | {id(leaf)}
        return len(np.ravel(leaf)).to_bytes(8, "little") + b"".join(
            len(part := _item(item, within)).to_bytes(8, "little") + part +
            type(item).__name__.encode() for item in items)
    if leaf.dtype.kind == "c":
        return _meant(np.real(leaf)) + _meant(np.imag(leaf))
    with np.errstate(over="ignore", invalid="ignore"):  # (past float64's range: inf, then
        high = np.asarray(leaf).astype(np.float64)  # what is left as its own value)
        return high.tobytes() + (np.asarray(leaf) - high).astype(np.float64).tobytes()


def _item(item: Any, within: frozenset) -> bytes:
    """An object array's item's bytes: another object array's as its items' (ragged lists of
    strings), but one it is within (an array that holds itself: for ever), by its type."""
    if isinstance(item, np.ndarray) and item.dtype.hasobject:
        return b"" if id(item) in within or len(within) > 16 else _meant(item, within)
    return leaf_bytes(as_numpy(item))


def _unset(dtype: np.dtype) -> bool:
    """Whether ``dtype`` leaves bytes unset: a long double's, or a structure's with padding
    or with such a field (one of objects is hashed item by item); an array-shaped field's,
    where its items' dtype does."""
    if dtype.subdtype is not None:
        return _unset(dtype.subdtype[0])
    if dtype.names:
        fields = [dtype[name] for name in dtype.names]
        return sum(f.itemsize for f in fields) != dtype.itemsize or any(
            _unset(f) or f.hasobject for f in fields)
    return dtype.kind in "fc" and dtype.itemsize > 8 + 8 * (dtype.kind == "c")
