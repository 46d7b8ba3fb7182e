"""What a record's leaf gives the hash of a state's records (``fingerprint``): the bytes that
hold its values, and none of those a dtype leaves unset.

Example:
    >>> import numpy as np
    >>> padded = np.zeros(1, np.dtype([("a", "i1"), ("b", "f8")], align=True))
    >>> len(leaf_bytes(padded))  # (9 bytes of values of its 16)
    9
"""

from __future__ import annotations

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
        return np.asarray(leaf)
    except OverflowError:  # (an int past 64 bits: as it is)
        return leaf


def leaf_bytes(leaf: Any) -> bytes:
    """The bytes of ``leaf``'s values: an array's (``_meant``'s where a dtype leaves bytes
    unset or holds objects), a str's, a number's text; ``b""`` for another object."""
    if isinstance(leaf, (np.ndarray, np.generic)) and not records_as_before() and (
            leaf.dtype.names or leaf.dtype.hasobject or leaf.dtype.kind in "fc" and
            leaf.dtype.itemsize > 8 + 8 * (leaf.dtype.kind == "c")):
        return _meant(leaf)
    if isinstance(leaf, (np.ndarray, np.generic)) and not leaf.dtype.hasobject:
        return np.ascontiguousarray(leaf).tobytes()
    if isinstance(leaf, str):
        return leaf.encode(errors="surrogatepass")  # (a name not in UTF-8: os.fsdecode's)
    if isinstance(leaf, (bytes, bool, int, float, complex)):
        return leaf if isinstance(leaf, bytes) else repr(leaf).encode()
    return b""  # other objects: their type is in the spec; a repr may hold an address


def _meant(leaf: np.ndarray | np.generic) -> bytes:
    """The bytes that hold ``leaf``'s values, not those a dtype leaves unset (an aligned
    structure's padding, a long double's last 6 of 16: other bytes each read, the source taken
    for one that draws as it reads, its values then unhashed), and an object array's items
    (an array of strings was left out: a state restored over other text): a structure field
    by field, a long double as two float64s (its value and what that left), objects each."""
    if leaf.dtype.names:
        return b"".join(leaf_bytes(np.asarray(leaf)[name]) for name in leaf.dtype.names)
    if leaf.dtype.hasobject:
        return b"".join(len(part := leaf_bytes(as_numpy(item))).to_bytes(8, "little") + part +
                        type(item).__name__.encode() for item in np.ravel(leaf))
    if leaf.dtype.kind == "c":
        return _meant(np.real(leaf)) + _meant(np.imag(leaf))
    high = np.asarray(leaf).astype(np.float64)
    return high.tobytes() + (np.asarray(leaf) - high).astype(np.float64).tobytes()
