"""jaxloader: a JAX/NumPy-native data loader, deterministic in ``(seed, epoch, step)``.

Example:
    >>> import numpy as np, jaxloader
    >>> source = jaxloader.ArraySource({"x": np.arange(10), "y": np.arange(10) % 2})
    >>> loader = jaxloader.DataLoader(source, batch_size=4, shuffle=True, seed=0,
    ...                               process_index=0, process_count=1)
    >>> [b["x"].shape for b in loader]
    [(4,), (4,)]
"""

from typing import TYPE_CHECKING

from jaxloader.errors import (
    CollateError,
    ConfigError,
    JaxloaderError,
    RecordError,
    SharedMemoryError,
    StateDictError,
    WorkerError,
)
from jaxloader.iterator import LoaderIterator
from jaxloader.loader import DataLoader
from jaxloader.sources import ArraySource, Source
from jaxloader.stats import LoaderStats
from jaxloader.transforms import BatchMap, Map, RandomMap
from jaxloader.workers import WorkerInfo, get_worker_info

__all__ = [
    "ArraySource",
    "BatchMap",
    "CollateError",
    "ConfigError",
    "DataLoader",
    "JaxloaderError",
    "LoaderIterator",
    "LoaderStats",
    "Map",
    "RandomMap",
    "RecordError",
    "SharedMemoryError",
    "Source",
    "StateDictError",
    "WorkerError",
    "WorkerInfo",
    "get_worker_info",
]
__version__ = "0.1.0"

if TYPE_CHECKING:  # for annotations only: importing jaxloader must not import JAX
    from jax.sharding import Mesh, NamedSharding


def data_sharding(mesh: "Mesh", data_axis: str | tuple[str, ...] = "data") -> "NamedSharding":
    """The batch axis split over ``data_axis`` of ``mesh``, the rest replicated.

    Imported on first use, so that ``import jaxloader`` (and every worker) stays free of JAX.

    Example:
        >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))     # doctest: +SKIP
        >>> loader = DataLoader(source, batch_size=64, sharding=data_sharding(mesh))  # doctest: +SKIP
    """
    from jaxloader.sharding.put import data_sharding as build

    return build(mesh, data_axis)


__all__.append("data_sharding")
