"""What a ``JitMap`` takes: the checks of a batch's leaves before XLA runs on them, each
refusal naming the leaf, what it holds, what JAX takes, and the remedy; and its records' keys.

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

from jaxloader.base.checks import MASK64, POSITION_BITS
from jaxloader.base.columns import (as_32_bits, beyond_32_bits, device_dtype_problem, host_only,
                                    warn_whole, what_32_bits_do)
from jaxloader.base.errors import RecordError
from jaxloader.batching import collate
from jaxloader.sources.code_digest import filled


def check_columns(columns: list, t: Any, where: Callable[[], str]) -> None:
    """Refuses a leaf JAX cannot take (strings, objects, another byte order, structured),
    naming it (``t``: the JitMap); bfloat16 and the other ``ml_dtypes`` it takes."""
    for column in columns:
        problem = device_dtype_problem(column.dtype)
        if problem is not None:
            raise RecordError(f"{where()}: {t} gets batch{column.path}: {problem}, before the "
                              "JitMap")
        if host_only(column.dtype):
            raise RecordError(
                f"{where()}: {t} gets batch{column.path} of dtype {column.dtype}, expected "
                "numbers (bool, int, uint, float, complex): JAX takes numeric arrays; turn it "
                "into numbers in a Map before the JitMap (text: token ids of a fixed length), "
                "or drop it there (a JitMap's batch passes no leaf it cannot take through)")


def checked_32_bits(column: Any, size: int, t: Any, where: Callable[[], str],
                    narrow: np.dtype) -> Any:
    """``column`` (64-bit numbers) gathered into one array, its values checked to fit 32 bits
    (``check_32_bits``) and made ``narrow`` (what JAX without x64 takes them as, the same
    values: NumPy's cast and JAX's round a float alike)."""
    values = collate.stack_rows(column, 0, size, np.empty(column.shape, column.dtype))
    check_32_bits(column, values, t, where)
    return column._replace(values=values.astype(narrow), dtype=narrow)


def check_32_bits(column: Any, values: np.ndarray, t: Any, where: Callable[[], str]) -> None:
    """Refuses 64-bit integers that 32 bits cannot hold (JAX without x64 would wrap them), and
    finite 64-bit floats beyond float32's (it would make them infinite)."""
    beyond = beyond_32_bits(values)
    if beyond is None and values.dtype == np.float64:
        warn_whole(values, lambda: f"batch{column.path}", f"{t}'s input", "takes")
    if beyond is not None:
        low, high, kind = beyond
        raise RecordError(
            f"{where()}: {t} gets batch{column.path} of dtype {column.dtype} with values "
            f"{low}..{high}, expected {kind.min}..{kind.max}: JAX without x64 takes it as "
            f"{as_32_bits(column.dtype)} and {what_32_bits_do(kind)}; drop it, or make it fit, "
            "in a Map "
            "before the JitMap, or set jax.config.update('jax_enable_x64', True) before the "
            "loader (its workers compile with the training process's)")


_KEY_SALT = 0x9E3779B97F4A7C15  # a JitMap's keys differ from each other's and a RandomMap's


def placed_elsewhere(fn: Any, device: Any) -> str:
    """Words for a remedy: the ``jax.Array``s ``fn`` closes over or names as globals (or holds
    in a dict, list or tuple there) that are not on ``device`` alone (a mesh's, a GPU's), which
    the function run on ``device`` cannot take; ``""`` when there are none (or where asking
    fails: the error it is said with stays the one to see)."""
    import jax

    code = getattr(fn, "__code__", None)
    if code is None:
        return ""
    try:
        named = dict(zip(code.co_freevars, getattr(fn, "__closure__", None) or ()))
        values = {name: cell.cell_contents for name, cell in named.items() if filled(cell)}
        space = getattr(fn, "__globals__", {})
        values.update({name: space[name] for name in code.co_names if name in space})
        for name, value in list(values.items()):  # (one level into containers: params)
            items = (value.items() if isinstance(value, dict) else
                     enumerate(value) if isinstance(value, (list, tuple)) else ())
            values.update({f"{name}[{key!r}]": v for key, v in items})
        elsewhere = [f"{name} (on {len(v.sharding.device_set)} device(s): "
                     f"{sorted({getattr(d, 'platform', '?') for d in v.sharding.device_set})})"
                     for name, v in values.items()
                     if isinstance(v, jax.Array) and v.sharding.device_set != {device}]
    except Exception:  # noqa: BLE001 - a hint only
        return ""
    if not elsewhere:
        return ""
    return (f"; a JitMap runs on one CPU device ({device}), and its function uses "
            f"{', '.join(elsewhere)}: close over a NumPy array instead (np.asarray(...)), "
            "which it takes on its device")


def record_keys(seed: int, epoch: int, positions: np.ndarray, index: int) -> np.ndarray:
    """Raw ``threefry2x32`` key data, ``uint32[n, 2]``: a SplitMix64 hash of ``(seed, index)``
    and each record's ``epoch << POSITION_BITS | position`` (RandomMap's words).

    Example:
        >>> k = record_keys(0, 0, np.arange(3), 0)
        >>> k.shape, k.dtype, len({tuple(r) for r in k.tolist()})
        ((3, 2), dtype('uint32'), 3)
    """
    with np.errstate(over="ignore"):
        base = _mix(np.array([(seed ^ (_KEY_SALT * (index + 1))) & MASK64], np.uint64))
        words = np.asarray(positions, np.uint64) | np.uint64((epoch << POSITION_BITS) & MASK64)
        h = _mix(_mix(words ^ base))
    return np.stack([h >> np.uint64(32), h & np.uint64(0xFFFFFFFF)], axis=1).astype(np.uint32)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser over an array (wrapping ``uint64`` arithmetic)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))
