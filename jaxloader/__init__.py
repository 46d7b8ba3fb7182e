"""jaxloader: a JAX/NumPy-native data loader, deterministic in ``(seed, epoch, step)``.

Example:
    >>> import numpy as np, jaxloader
    >>> source = jaxloader.ArraySource({"x": np.arange(10), "y": np.arange(10) % 2})
    >>> loader = jaxloader.DataLoader(source, batch_size=4, shuffle=True, seed=0,
    ...                               process_index=0, process_count=1)
    >>> [b["x"].shape for b in loader]
    [(4,), (4,)]
"""

from jaxloader.errors import (
    CollateError,
    ConfigError,
    JaxloaderError,
    RecordError,
    StateDictError,
    WorkerError,
)
from jaxloader.loader import DataLoader, LoaderIterator
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
    "Source",
    "StateDictError",
    "WorkerError",
    "WorkerInfo",
    "get_worker_info",
]
__version__ = "0.1.0"


def data_sharding(mesh, data_axis="data"):  # noqa: ANN001, ANN201 - re-exported lazily
    """The batch axis split over ``data_axis`` of ``mesh``, the rest replicated.

    Imported on first use so that ``import jaxloader`` (and every worker) stays free of JAX.
    See ``jaxloader.sharding.put.data_sharding``.
    """
    from jaxloader.sharding.put import data_sharding as build

    return build(mesh, data_axis)


__all__.append("data_sharding")
