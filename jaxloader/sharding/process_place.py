"""Which process a sharded loader is, among the processes that share each global batch.

With several JAX processes, a sharding puts each process's devices at some rows of the global
batch. A ``StreamLoader``'s rows are its own readers', so its place is the block of rows its
devices hold (``Putter.block``); a ``DataLoader`` reads whichever rows they hold
(``Putter.rows``), so its place is JAX's process. A ``process_index`` given that says otherwise
is refused where the loader is made: read as given, a stream's rows would land out of order, and
a ``DataLoader``'s would be named (its checkpoint file, the processes' checks) as another's.

Example:
    >>> import jax, jaxloader as jl
    >>> from jaxloader.sharding.put import Putter
    >>> putter = Putter(jl.data_sharding(jax.make_mesh((1,), ("data",))), 1, 4)
    >>> process_place(putter, 0, None, by_block=True)
    0
"""

from __future__ import annotations

import jax

from jaxloader.base.errors import ConfigError
from jaxloader.sharding.put import Putter


def process_place(putter: Putter, index: int, given_index: object, *, by_block: bool) -> int:
    """The process index of a loader placed by ``putter``: ``index`` (``given_index``, or JAX's
    where that is None), or, ``by_block`` (a stream's), the block its devices hold. Raises
    ``ConfigError`` where a ``given_index`` disagrees with the sharding."""
    batch_size = putter.batch_size or 1
    block = putter.block(index) if by_block else index
    if block != index and given_index is not None:
        raise ConfigError(
            f"process_index={given_index}: the sharding puts this process's devices at rows "
            f"{block * batch_size}..{(block + 1) * batch_size - 1} of the global batch, where "
            f"process {given_index} reads rows {index * batch_size}.."
            f"{(index + 1) * batch_size - 1} (they would land out of order); leave "
            "process_index None: the loader takes the rows the sharding puts here")
    me = jax.process_index()
    if not by_block and given_index is not None and index != me and putter.rows() is not None:
        raise ConfigError(
            f"process_index={given_index}: this is JAX's process {me} of "
            f"{putter.process_count}, whose devices the sharding gives the rows it reads, "
            "named as another process's (its checkpoint file, the processes' checks); leave "
            "process_index None (JAX's) or pass jax.process_index()")
    return block
