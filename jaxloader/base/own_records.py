"""``top_copy``: a record's top level copied before the user's code gets it, where the record
may be one its source keeps (a list of dicts, a dataset class's ``self.samples[i]``, a
generator yielding dicts it holds, a ``MapSource`` function's cache): a ``Map`` that sets a key
and returns the record (``r["x"] = r["x"] / 2; return r``, the PyTorch habit) otherwise
rewrote the source's own record, each epoch halved again, without a word. Arrays inside are
not copied: writing into one in place still reaches the source (docs/semantics.md).

Example:
    >>> kept = {"x": 8.0}
    >>> record = top_copy(kept)
    >>> record["x"] = record["x"] / 2
    >>> kept["x"], record is kept
    (8.0, False)
"""

from __future__ import annotations

import copy
from typing import Any


def top_copy(record: Any) -> Any:
    """``record``'s top level copied where it is a dict or a list (its own type: an
    ``OrderedDict`` stays one), else ``record`` itself."""
    if type(record) is dict:  # (the usual record: the fast copy)
        return dict(record)
    if isinstance(record, (dict, list)):
        return copy.copy(record)
    return record
