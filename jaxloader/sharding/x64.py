"""What JAX without x64 (its default) does to a batch's 64-bit leaves as it places them, and
what the loader says of it: integers past 32 bits (which it would wrap) and finite floats
beyond float32's range (which it would make infinite) refused; float64 whole numbers past
2**24 (times in seconds, ids as floats), which float32 rounds together, warned of once a leaf.

Example:
    >>> import numpy as np
    >>> check_32_bits({"x": np.arange(3)}, [np.arange(3)])
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxloader.base.columns import as_32_bits, beyond_32_bits, warn_whole, what_32_bits_do
from jaxloader.base.errors import ConfigError

def check_32_bits(batch: Any, leaves: list) -> None:
    """Refuses 64-bit integers that 32 bits cannot hold: JAX without x64 places them as 32-bit
    and would wrap them (an id past 2**31, a time in nanoseconds) without a word; and finite
    64-bit floats beyond float32's range, which it makes infinite. Warns, once a leaf in a
    process, of float64 whole numbers past 2**24, which float32 rounds together (times in
    seconds: ``warn_whole``). (Other 64-bit floats become float32 as JAX makes them: precision
    lost, and those under 1.4e-45 become 0, as devices_and_hosts.md says.)"""
    for i, leaf in enumerate(leaves):
        beyond = beyond_32_bits(leaf) if isinstance(leaf, (np.ndarray, np.generic)) else None
        if beyond is None:
            if isinstance(leaf, (np.ndarray, np.generic)) and leaf.dtype == np.float64:
                warn_whole(leaf, lambda: _path(batch, i), "sharding: batch leaf", "places")
            continue
        low, high, kind = beyond
        path = _path(batch, i)
        fit = (f"an offset, or a split into two {kind.dtype} leaves"
               if kind.dtype.kind != "f" else "a scale, or a log")
        raise ConfigError(
            f"sharding: batch leaf {path} of dtype {leaf.dtype} holds values "
            f"{low}..{high}, expected {kind.min}..{kind.max}: JAX without x64 places it as "
            f"{as_32_bits(leaf.dtype)} and {what_32_bits_do(kind)}; make it fit (a Map: {fit}), or "
            "jax.config.update('jax_enable_x64', True) before the loader (or a with "
            "jax.enable_x64(True): block entered before iter(), whose setting its thread takes)")


def _path(batch: Any, i: int) -> str:
    return jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(batch)[0][i][0]) or "<root>"

