"""A device's sharding and the test for one, as the running JAX (0.10 to the newest) has them:
``SingleDeviceSharding`` is deprecated from JAX 0.12, which has ``make_single_device_sharding``
and ``is_single_device_sharding`` instead. JAX is imported when they are called, not here
(workers without a ``JitMap`` never import it).

Example:
    >>> import jax
    >>> is_one_device(one_device(jax.devices()[0]))
    True
"""

from __future__ import annotations

from typing import Any


def one_device(device: Any) -> Any:
    """``device``'s sharding, as the running JAX makes it: ``SingleDeviceSharding`` is
    deprecated from JAX 0.12 (under ``-W error`` the loader failed), which has
    ``make_single_device_sharding`` instead."""
    import jax

    make = getattr(jax.sharding, "make_single_device_sharding", None)
    return make(device) if make is not None else jax.sharding.SingleDeviceSharding(device)


def is_one_device(sharding: Any) -> bool:
    """Whether ``sharding`` is one device's (``one_device``'s kind)."""
    import jax

    check = getattr(jax.sharding, "is_single_device_sharding", None)
    return bool(check(sharding)) if check is not None else isinstance(
        sharding, jax.sharding.SingleDeviceSharding)
