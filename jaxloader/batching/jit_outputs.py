"""A ``JitMap``'s output: XLA's leaves put in the order of what the function returned (its dicts'
keys as it wrote them, where ``jax.jit`` sorts them), viewed and written into the batch.

Example:
    >>> import numpy as np
    >>> record_kind({"x": np.zeros((4, 3), np.uint8)}, lead=1)[1]
    (((3,), 'uint8'),)
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from jaxloader.base import tree as tree_lib
from jaxloader.base.batch_kinds import unsortable
from jaxloader.base.errors import RecordError

# said after JAX's bare error for a dict the function returns whose keys it cannot sort
UNSORTED = (" (JAX sorts a dict's keys to flatten it: the dicts the function returns need keys "
            "of one type, str(key) for each)")


def check_keys(transform: Any, record: Any, where: Callable[[], str]) -> None:
    """Refuses records holding a dict whose keys JAX cannot sort to flatten it (an int key
    beside a str one): its bare "Comparator raised exception" named no dict, nor the step."""
    if (found := unsortable(record)) is not None:
        raise RecordError(f"{where()}: {transform!r} gets records whose {found}; make them one "
                          "type in a Map before it (str(key) for each)")


def check_row_output(transform: Any, out: Any, where: Callable[[], str], hint: str) -> None:
    """Refuses what ``transform``'s function returns for one row (``out``: its traced
    structure) where a batch cannot hold it: nothing (``None``, a missing ``return``: was
    refused by the collation, which named the source and the batch transforms, not the
    JitMap) or a ``jax.random`` key (``hint``: said after the latter's remedy)."""
    import jax

    if not jax.tree.leaves(out):
        raise RecordError(
            f"{where()}: {transform!r} returns {'None' if out is None else repr(out)}, no "
            "array: a JitMap's function returns the record it made, a dict or tuple of "
            "arrays (a missing `return`?)")
    for path, x in jax.tree_util.tree_flatten_with_path(out)[0]:
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            raise RecordError(
                f"{where()}: {transform!r} returns a jax.random key at "
                f"{jax.tree_util.keystr(path) or '<root>'} ({x.dtype}), which a batch "
                "cannot hold; return jax.random.key_data(key) (its uint32 words)" + hint)


def host_leaves(out: Any, order: list[int] | None) -> list[np.ndarray]:
    """``out``'s leaves as NumPy views, in this package's order (``order``: ``leaf_order``'s)."""
    import jax

    if order is None:
        return [np.asarray(leaf) for leaf in tree_lib.flatten(out)[0]]
    found = jax.tree.leaves(out)
    return [np.asarray(found[i]) for i in order]


def write_rows(views: list, leaves: list, a: int, b: int) -> None:
    """Rows ``a`` to ``b`` of ``views`` from ``leaves`` (a function: no name is left holding a
    leaf after it)."""
    for view, leaf in zip(views, leaves):
        view[a:b] = leaf[:b - a]


def leaf_order(out: Any, ordered: Any) -> list[int] | None:
    """Where each leaf of ``ordered`` (``out``'s leaves, reordered as fn wrote them), in this
    package's order (its tree's), is among ``out``'s in JAX's (``jax.tree.leaves``, the faster
    to ask a chunk), or ``None`` where they differ in number. A dict's keys are in their order
    here, sorted in JAX's; an ``OrderedDict``'s in their order in both, where ``ordered`` may
    hold a plain dict of them.

    Example:
        >>> import jax.numpy as jnp
        >>> out = {"b": jnp.zeros(1), "a": (jnp.ones(1), jnp.zeros(2))}
        >>> leaf_order(out, out)
        [2, 0, 1]
    """
    import jax

    where = {id(leaf): i for i, leaf in enumerate(jax.tree.leaves(out))}
    order = [where.get(id(leaf)) for leaf in tree_lib.flatten(ordered)[0]]
    if None in order or len(order) != len(where):
        return None
    return [i for i in order if i is not None]  # (all of them: for the type checker)


def record_kind(record: Any, lead: int = 0) -> tuple:
    """A record's kind, the same inside fn's trace (``lead`` 0) and for a chunk of such
    records (``lead`` 1: the rows' axis left out): its structure, its leaves' shapes and
    dtypes."""
    import jax

    leaves, structure = jax.tree.flatten(record)
    return structure, tuple((tuple(x.shape[lead:]), str(x.dtype)) for x in leaves)


def aliases(leaf: np.ndarray, inputs: list) -> bool:
    """Whether ``leaf`` is in one of ``inputs`` (an input returned as it is), which the next
    batch overwrites."""
    return any(np.may_share_memory(leaf, buffer) for buffer in inputs)


def row_bytes(shape: tuple, dtype: Any) -> int:
    """Bytes of one row of a leaf of ``shape`` (rows first)."""
    return int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dtype).itemsize
