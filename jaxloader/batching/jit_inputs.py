"""What a ``JitMap`` can take: the checks of a batch's leaves before XLA runs on them, each
refusal naming the leaf, what it holds, what JAX takes, and the remedy.

Example:
    >>> import numpy as np
    >>> from jaxloader.batching.record_columns import batch_columns
    >>> _, columns = batch_columns({"id": np.array([1, 2**40])}, 2)
    >>> try:
    ...     check_32_bits(columns[0], columns[0].values, "JitMap(f)", lambda: "step 3")
    ... except Exception as e:
    ...     print(str(e)[:78])
    step 3: JitMap(f) gets batch['id'] of dtype int64 with values 1..1099511627776
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from jaxloader.base.errors import RecordError


def check_columns(columns: list, t: Any, where: Callable[[], str]) -> None:
    """Refuses a leaf JAX cannot take (strings, objects), naming it (``t``: the JitMap)."""
    for column in columns:
        if column.dtype.kind not in "biufc":
            raise RecordError(
                f"{where()}: {t} gets batch{column.path} of dtype {column.dtype}, expected "
                "numbers (bool, int, uint, float, complex): JAX takes numeric arrays; turn it "
                "into numbers in a Map before the JitMap, or drop it there")


def check_32_bits(column: Any, values: np.ndarray, t: Any, where: Callable[[], str]) -> None:
    """Refuses 64-bit integers that 32 bits cannot hold (JAX without x64 would wrap them)."""
    if not values.size:
        return
    low, high = int(values.min()), int(values.max())
    kind = np.iinfo(np.uint32 if column.dtype.kind == "u" else np.int32)
    if low < kind.min or high > kind.max:
        raise RecordError(
            f"{where()}: {t} gets batch{column.path} of dtype {column.dtype} with values "
            f"{low}..{high}, expected {kind.min}..{kind.max}: JAX without x64 takes it as "
            f"{kind.dtype} and would wrap them; drop it, or make it fit, in a Map before the "
            "JitMap, or set jax.config.update('jax_enable_x64', True) in worker_init_fn and "
            "before the loader")
