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
